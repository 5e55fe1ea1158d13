#include "pkg/identity/following_hash.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <map>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "pkg/util/log.h"
#include "pkg/util/status_macros.h"

namespace weightcache::identity {

struct FollowingSha256::State {
  File file;
  size_t index = 0;
  dev_t dev = 0;
  ino_t ino = 0;
  Mutex mu;
  // Used by one thread at a time without `mu`: the hasher whose turn it is (`queued`), or,
  // once no turn is left, Start and Finish.
  EVP_MD_CTX* ctx = nullptr;
  uint64_t cursor ABSL_GUARDED_BY(mu) = 0;
  bool done ABSL_GUARDED_BY(mu) = false;
  bool queued ABSL_GUARDED_BY(mu) = false;  // a hasher's turn: queued or hashing
  std::string digest ABSL_GUARDED_BY(mu);
  std::map<uint64_t, std::vector<uint8_t>> held ABSL_GUARDED_BY(mu);  // by file offset
  // Chunks offered and left (the hold was full): offset -> end. The hasher reads one itself
  // when its cursor reaches it, so one left chunk costs one chunk's read, not the rest of
  // the file (the hash could not pass the gap, and every later chunk would be left too).
  std::map<uint64_t, uint64_t> left ABSL_GUARDED_BY(mu);
};

FollowingSha256::FollowingSha256(std::vector<File> files, uint64_t hold_bytes,
                                 std::function<void(size_t, const std::string&)> on_file,
                                 unsigned hashers, std::chrono::milliseconds stall)
    : hold_bytes_(hold_bytes), stall_(stall), on_file_(std::move(on_file)) {
  for (size_t i = 0; i < files.size(); ++i) {
    auto s = std::make_unique<State>();
    s->file = std::move(files[i]);
    s->index = i;
    struct stat st {};
    if (::fstat(s->file.fd, &st) == 0) s->dev = st.st_dev, s->ino = st.st_ino;
    s->ctx = EVP_MD_CTX_new();
    WC_CHECK(s->ctx != nullptr && EVP_DigestInit_ex(s->ctx, EVP_sha256(), nullptr) == 1);
    files_.push_back(std::move(s));
  }
  if (hashers == 0) hashers = std::max(2u, std::thread::hardware_concurrency() / 2);
  const size_t n = std::min<size_t>(hashers, files_.size());
  for (size_t t = 0; t < n; ++t) hashers_.emplace_back([this] { Hasher(); });
}

FollowingSha256::~FollowingSha256() {
  {
    MutexLock l(pool_mu_);
    stop_ = true;
  }
  work_cv_.NotifyAll();
  for (auto& t : hashers_) t.join();
  for (auto& s : files_) EVP_MD_CTX_free(s->ctx);
}

FollowingSha256::State* FollowingSha256::Find(int fd) {
  for (auto& s : files_) {
    if (s->file.fd == fd) return s.get();
  }
  MutexLock l(alias_mu_);
  for (const auto& [a, i] : aliases_) {
    if (a == fd) return i < 0 ? nullptr : files_[static_cast<size_t>(i)].get();
  }
  long found = -1;
  struct stat st {};
  if (::fstat(fd, &st) == 0) {
    for (const auto& s : files_) {
      if (s->dev == st.st_dev && s->ino == st.st_ino) found = static_cast<long>(s->index);
    }
  }
  aliases_.emplace_back(fd, found);
  return found < 0 ? nullptr : files_[static_cast<size_t>(found)].get();
}

void FollowingSha256::Released(uint64_t n) {
  held_ -= n;
  { MutexLock l(pool_mu_); }  // a waiter between its check and its wait sees the change
  room_cv_.NotifyAll();
}

bool FollowingSha256::Admit(State& s, int fd, uint64_t offset, uint64_t n) {
  auto take = [&] {
    uint64_t h = held_.load();
    while (h + n <= hold_bytes_) {
      if (held_.compare_exchange_weak(h, h + n)) return true;
    }
    return false;
  };
  if (take()) return true;
  // Through the page cache a chunk left is read again from memory, as a rule; through
  // O_DIRECT it would be read from storage again: wait for room, never leave it.
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0 || (flags & O_DIRECT) == 0) return false;
  const auto waited_from = std::chrono::steady_clock::now();
  auto idle_since = waited_from;
  pool_mu_.Lock();
  for (;;) {
    if (take()) break;
    {
      // The hash may have reached this chunk while it waited: a chunk at the cursor is always
      // taken (else the hash would wait for the very chunk that waits for it, and a hole
      // would be read again).
      MutexLock l(s.mu);
      if (s.done || offset <= s.cursor) {
        held_ += n;
        break;
      }
    }
    if (stop_) {
      pool_mu_.Unlock();
      NoteWait(waited_from);
      return false;
    }
    const auto now = std::chrono::steady_clock::now();
    if (turns_ > 0) {
      idle_since = now;
    } else if (now - idle_since >= stall_) {
      // The hold is full of chunks ahead of their cursors and no hash has moved for a while:
      // a cursor's chunk is not coming (a range no reader reads) or is slow. The hasher of the
      // file with the smallest hole reads it, then hashes what it holds: room.
      pool_mu_.Unlock();
      FillHole();
      idle_since = std::chrono::steady_clock::now();
      pool_mu_.Lock();
      continue;
    }
    room_cv_.WaitUntil(pool_mu_, now + std::chrono::milliseconds(10));
  }
  pool_mu_.Unlock();
  NoteWait(waited_from);
  return true;
}

void FollowingSha256::NoteWait(std::chrono::steady_clock::time_point from) {
  room_wait_ns_ += static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - from)
          .count());
}

void FollowingSha256::FillHole() {
  State* best = nullptr;
  uint64_t best_hole = 0;
  for (auto& f : files_) {
    MutexLock l(f->mu);
    if (f->done || f->queued || f->held.empty()) continue;
    const uint64_t first = f->held.begin()->first;
    if (first <= f->cursor) continue;  // its turn is coming
    if (best == nullptr || first - f->cursor < best_hole) {
      best = f.get();
      best_hole = first - f->cursor;
    }
  }
  if (best == nullptr) return;
  bool queue = false;
  {
    MutexLock l(best->mu);
    if (best->done || best->queued || best->held.empty() ||
        best->held.begin()->first <= best->cursor) {
      return;  // moved meanwhile
    }
    uint64_t& end = best->left[best->cursor];
    end = std::max(end, best->held.begin()->first);
    queue = best->queued = true;
  }
  holes_filled_++;
  if (queue) Queue(*best);
}

void FollowingSha256::Offer(int fd, uint64_t offset, const void* data, uint64_t n) {
  State* s = Find(fd);
  if (s == nullptr || offset >= s->file.size) return;
  n = std::min(n, s->file.size - offset);
  bool at_cursor = false;
  {
    MutexLock l(s->mu);
    if (s->done || offset + n <= s->cursor) return;  // hashed already (read twice)
    at_cursor = offset <= s->cursor;
  }
  // A chunk at the cursor is always taken (the hash waits for it); one ahead only with room.
  if (at_cursor) {
    held_ += n;
  } else if (!Admit(*s, fd, offset, n)) {
    Left(*s, offset, n);
    return;
  }
  const auto* bytes = static_cast<const uint8_t*>(data);
  std::vector<uint8_t> copy(bytes, bytes + n);  // outside the lock: readers copy side by side
  uint64_t unused = 0;
  bool queue = false;
  {
    MutexLock l(s->mu);
    auto& slot = s->held[offset];
    if (s->done || offset + n <= s->cursor || slot.size() >= n) {
      unused = n;  // hashed meanwhile, or held already
      if (slot.empty()) s->held.erase(offset);
    } else {
      unused = slot.size();
      slot = std::move(copy);
      if (!s->queued && s->held.begin()->first <= s->cursor) queue = s->queued = true;
    }
  }
  if (unused > 0) Released(unused);
  if (queue) Queue(*s);
}

void FollowingSha256::Left(State& s, uint64_t offset, uint64_t n) {
  bool queue = false;
  {
    MutexLock l(s.mu);
    if (s.done || offset + n <= s.cursor) return;
    uint64_t& end = s.left[offset];
    end = std::max(end, offset + n);
    // The cursor may have reached it meanwhile, with the file's turn over: start one.
    if (!s.queued && offset <= s.cursor) queue = s.queued = true;
  }
  if (queue) Queue(s);
}

void FollowingSha256::Queue(State& s) {
  {
    MutexLock l(pool_mu_);
    ready_.push_back(&s);
    ++turns_;
  }
  work_cv_.NotifyOne();
}

void FollowingSha256::Hasher() {
  for (;;) {
    State* s = nullptr;
    {
      MutexLock l(pool_mu_);
      while (ready_.empty() && !stop_) work_cv_.Wait(pool_mu_);
      if (ready_.empty()) return;
      s = ready_.front();
      ready_.pop_front();
    }
    HashHeld(*s);
    {
      MutexLock l(pool_mu_);
      --turns_;
    }
    room_cv_.NotifyAll();  // Finish and the O_DIRECT readers wait for turns to end
  }
}

void FollowingSha256::HashHeld(State& s) {
  for (;;) {
    std::vector<uint8_t> bytes;
    uint64_t off = 0, skip = 0, dropped = 0, gap_end = 0;
    {
      MutexLock l(s.mu);
      while (!s.held.empty() && s.held.begin()->first + s.held.begin()->second.size() <= s.cursor) {
        dropped += s.held.begin()->second.size();  // hashed from another offer already
        s.held.erase(s.held.begin());
      }
      while (!s.left.empty() && s.left.begin()->second <= s.cursor) s.left.erase(s.left.begin());
      const bool held_next = !s.done && !s.held.empty() && s.held.begin()->first <= s.cursor;
      if (!held_next && !s.done && !s.left.empty() && s.left.begin()->first <= s.cursor) {
        gap_end = s.left.begin()->second;  // a chunk left at the cursor: read it here
        s.left.erase(s.left.begin());
        off = s.cursor;
      } else if (!held_next) {
        s.queued = false;  // the turn ends: the next chunk at the cursor queues the file again
      } else {
        auto node = s.held.extract(s.held.begin());
        off = node.key();
        bytes = std::move(node.mapped());
        skip = s.cursor - off;
      }
    }
    if (dropped > 0) Released(dropped);
    if (gap_end > 0) {
      if (!ReadGap(s, off, gap_end)) return;  // s.queued cleared: Finish reads it
      continue;
    }
    if (bytes.empty()) return;
    // Only this turn's hasher moves the cursor: the context is used outside the lock, so
    // readers copy while it hashes.
    HashFollowed(s, bytes.data() + skip, bytes.size() - skip);
    std::string digest;
    bool complete = false;
    {
      MutexLock l(s.mu);
      s.cursor = off + bytes.size();
      complete = Complete(s, &digest);
    }
    Released(bytes.size());
    if (complete && on_file_) on_file_(s.index, digest);
  }
}

void FollowingSha256::HashFollowed(State& s, const uint8_t* data, uint64_t n) {
  const auto t0 = std::chrono::steady_clock::now();
  WC_CHECK(EVP_DigestUpdate(s.ctx, data, n) == 1);
  hash_ns_ += static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0)
          .count());
  followed_ += n;
}

bool FollowingSha256::ReadGap(State& s, uint64_t from, uint64_t end) {
  uint64_t at = from;
  // Without s.mu: only this turn's hasher uses the context and moves the cursor.
  const bool read = ReadHashed(s, &at, end, nullptr).ok();  // else Finish names the error
  std::string digest;
  bool complete = false;
  {
    MutexLock l(s.mu);
    s.cursor = at;
    if (!read) {
      s.queued = false;
      return false;
    }
    complete = Complete(s, &digest);
  }
  if (complete && on_file_) on_file_(s.index, digest);
  return true;
}

void FollowingSha256::Drain(State& s) ABSL_NO_THREAD_SAFETY_ANALYSIS {  // s.mu held
  while (!s.held.empty() && s.held.begin()->first <= s.cursor) {
    auto node = s.held.extract(s.held.begin());
    const uint64_t off = node.key();
    const std::vector<uint8_t>& bytes = node.mapped();
    held_ -= bytes.size();
    if (off + bytes.size() > s.cursor) {
      const uint64_t skip = s.cursor - off;
      HashFollowed(s, bytes.data() + skip, bytes.size() - skip);
      s.cursor = off + bytes.size();
    }
  }
}

bool FollowingSha256::Complete(State& s,
                               std::string* digest) ABSL_NO_THREAD_SAFETY_ANALYSIS {  // s.mu held
  if (s.done || s.cursor < s.file.size) return false;
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  WC_CHECK(EVP_DigestFinal_ex(s.ctx, md, &n) == 1);
  s.digest = "sha256:";
  for (unsigned int i = 0; i < n; ++i) absl::StrAppendFormat(&s.digest, "%02x", md[i]);
  s.done = true;
  for (auto& [off, bytes] : s.held) held_ -= bytes.size();
  s.held.clear();
  *digest = s.digest;
  return true;
}

absl::Status FollowingSha256::ReadHashed(State& s, uint64_t* at, uint64_t end,
                                         const std::atomic<bool>* cancel) {
  std::vector<uint8_t> buf(std::min<uint64_t>(end - *at, 8ull << 20));
  while (*at < end) {
    if (cancel != nullptr && cancel->load()) {
      return absl::CancelledError(
          absl::StrCat(s.file.path, ": the digest was not finished (the load was stopped)"));
    }
    const uint64_t want = std::min<uint64_t>(buf.size(), end - *at);
    const ssize_t got = ::pread(s.file.fd, buf.data(), want, static_cast<off_t>(*at));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      return absl::DataLossError(
          absl::StrCat(s.file.path, ": read for its SHA-256 at byte ", *at, " of ", s.file.size,
                       ": ", got < 0 ? std::strerror(errno) : "the file ended (it was truncated)"));
    }
    WC_CHECK(EVP_DigestUpdate(s.ctx, buf.data(), static_cast<size_t>(got)) == 1);
    reread_ += static_cast<uint64_t>(got);
    *at += static_cast<uint64_t>(got);
  }
  return absl::OkStatus();
}

absl::Status FollowingSha256::Start(size_t i, uint64_t n) {
  State& s = *files_.at(i);
  MutexLock l(s.mu);
  if (s.cursor >= n) return absl::OkStatus();
  return ReadHashed(s, &s.cursor, std::min(n, s.file.size), nullptr);
}

absl::Status FollowingSha256::FinishOne(State& s, const std::atomic<bool>* cancel) {
  MutexLock l(s.mu);
  while (!s.done) {
    Drain(s);
    std::string digest;
    if (Complete(s, &digest)) break;
    const uint64_t next = s.held.empty() ? s.file.size : s.held.begin()->first;
    WC_RETURN_IF_ERROR(ReadHashed(s, &s.cursor, next, cancel));
    Complete(s, &digest);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> FollowingSha256::Finish(const std::atomic<bool>* cancel,
                                                                 unsigned threads) {
  {
    MutexLock l(pool_mu_);  // the hashers first hash what they hold
    while (turns_ > 0) room_cv_.Wait(pool_mu_);
  }
  // Files side by side: what is left of each is one sequential hash.
  std::vector<absl::Status> errors(files_.size());
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i = next++; i < files_.size(); i = next++)
      errors[i] = FinishOne(*files_[i], cancel);
  };
  std::vector<std::thread> pool;
  const size_t n = std::min<size_t>(std::max(1u, threads), files_.size());
  for (size_t t = 1; t < n; ++t) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
  std::vector<std::string> out;
  for (size_t i = 0; i < files_.size(); ++i) {
    WC_RETURN_IF_ERROR(errors[i]);
    MutexLock l(files_[i]->mu);
    out.push_back(files_[i]->digest);
  }
  return out;
}

}  // namespace weightcache::identity
