// A file's plain SHA-256 with its reads running ahead of the hash (identity.h: Sha256File).
// One file's SHA-256 is sequential: one core, about 1.3 GB/s with SHA-NI. Read and hashed in
// turn by one thread, every read's wait adds to it (a cold 2.5 GB file: 1.0 GB/s on the
// development VM against 1.36 GB/s for openssl over memory); here reader threads fill a small
// ring of chunks, in order, while the calling thread hashes the ones before, so the hash
// waits for storage only where storage is slower than it. The reads go through the page
// cache: a load that follows the first sight of a file is served from what they read.
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "pkg/identity/identity.h"
#include "pkg/identity/internal/sha256.h"
#include "pkg/util/bytes.h"
#include "pkg/util/errno_status.h"
#include "pkg/util/log.h"
#include "pkg/util/mutex.h"
#include "pkg/util/status_macros.h"

namespace weightcache::identity {
namespace {

constexpr uint64_t kChunkBytes = 8ull << 20;  // one pread into the ring
constexpr size_t kSlots = 6;                  // chunks read ahead of the hash, at most
constexpr unsigned kReaders = 3;

using internal::Sha256;

// Reads [off, off + n) of `fd` whole into `dst`: the error names `what` and the byte; a file
// that ends early is DATA_LOSS; CANCELLED once `cancel` turns true.
absl::Status ReadWhole(int fd, uint64_t off, size_t n, unsigned char* dst, uint64_t size,
                       const std::string& what, const std::atomic<bool>* cancel) {
  for (size_t got = 0; got < n;) {
    if (cancel != nullptr && cancel->load()) {
      return absl::CancelledError(what + ": hashing stopped (the daemon is stopping)");
    }
    const ssize_t r = ::pread(fd, dst + got, n - got, static_cast<off_t>(off + got));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return ErrnoStatus(errno, "pread", what);
    if (r == 0) {
      return absl::DataLossError(
          absl::StrCat(what, ": ends at byte ", off + got, ", expected ", size, " bytes"));
    }
    got += static_cast<size_t>(r);
  }
  return absl::OkStatus();
}

// The ring: chunk c lives in slot c % kSlots; a reader takes chunk c only once chunk
// c - kSlots is hashed, so a slot is never written while it is hashed.
class ReadAhead {
 public:
  ReadAhead(int fd, uint64_t size, const std::string& what, const std::atomic<bool>* cancel)
      : fd_(fd),
        size_(size),
        chunks_((size + kChunkBytes - 1) / kChunkBytes),
        what_(what),
        cancel_(cancel) {
    for (auto& s : slots_) s.buf.resize(kChunkBytes);
    const unsigned n = static_cast<unsigned>(std::min<uint64_t>(kReaders, chunks_));
    for (unsigned i = 0; i < n; ++i) readers_.emplace_back([this] { Read(); });
  }
  ~ReadAhead() {
    {
      MutexLock l(mu_);
      stop_ = true;
    }
    cv_.NotifyAll();
    for (auto& t : readers_) t.join();
  }
  ReadAhead(const ReadAhead&) = delete;
  ReadAhead& operator=(const ReadAhead&) = delete;

  absl::StatusOr<std::string> Hash() {
    Sha256 h;
    for (uint64_t c = 0; c < chunks_; ++c) {
      Slot& s = slots_[c % kSlots];
      size_t n = 0;
      {
        MutexLock l(mu_);
        while (!(s.ready && s.chunk == c)) cv_.Wait(mu_);
        if (!s.status.ok()) return s.status;
        n = s.bytes;
      }
      h.Update(s.buf.data(), n);  // the slot is this thread's until `hashed_` passes it
      {
        MutexLock l(mu_);
        s.ready = false;
        ++hashed_;
      }
      cv_.NotifyAll();
    }
    return h.HexFinal();
  }

 private:
  struct Slot {
    std::vector<unsigned char> buf;
    uint64_t chunk = 0;
    size_t bytes = 0;
    bool ready = false;
    absl::Status status;
  };

  void Read() {
    for (;;) {
      uint64_t c = 0;
      {
        MutexLock l(mu_);
        while (!stop_ && !failed_ && next_ < chunks_ && next_ >= hashed_ + kSlots) cv_.Wait(mu_);
        if (stop_ || failed_ || next_ >= chunks_) return;
        c = next_++;
      }
      Slot& s = slots_[c % kSlots];
      const uint64_t off = c * kChunkBytes;
      const size_t n = static_cast<size_t>(std::min<uint64_t>(kChunkBytes, size_ - off));
      absl::Status st = ReadWhole(fd_, off, n, s.buf.data(), size_, what_, cancel_);
      {
        MutexLock l(mu_);
        s.chunk = c;
        s.bytes = n;
        failed_ = failed_ || !st.ok();
        s.status = std::move(st);
        s.ready = true;
      }
      cv_.NotifyAll();
    }
  }

  const int fd_;
  const uint64_t size_, chunks_;
  const std::string& what_;
  const std::atomic<bool>* const cancel_;
  // The buffers are written by the reader that took the chunk and read by the hasher, handed
  // over through `ready` under mu_.
  std::array<Slot, kSlots> slots_;
  Mutex mu_;
  CondVar cv_;
  uint64_t next_ ABSL_GUARDED_BY(mu_) = 0;    // the next chunk a reader takes
  uint64_t hashed_ ABSL_GUARDED_BY(mu_) = 0;  // chunks hashed
  bool failed_ ABSL_GUARDED_BY(mu_) = false;  // a read failed: no more are started
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> readers_;
};

}  // namespace

absl::StatusOr<std::string> Sha256File(int fd, uint64_t size, const std::string& what,
                                       const std::atomic<bool>* cancel) {
  if (size <= kChunkBytes) {  // one read: no thread to start
    std::vector<unsigned char> buf(static_cast<size_t>(size));
    WC_RETURN_IF_ERROR(ReadWhole(fd, 0, buf.size(), buf.data(), size, what, cancel));
    Sha256 h;
    h.Update(buf.data(), buf.size());
    return h.HexFinal();
  }
  ReadAhead r(fd, size, what, cancel);
  return r.Hash();
}

}  // namespace weightcache::identity
