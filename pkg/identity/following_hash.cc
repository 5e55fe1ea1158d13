#include "pkg/identity/following_hash.h"

#include <openssl/evp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
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
  EVP_MD_CTX* ctx ABSL_GUARDED_BY(mu) = nullptr;
  uint64_t cursor ABSL_GUARDED_BY(mu) = 0;
  bool done ABSL_GUARDED_BY(mu) = false;
  std::string digest ABSL_GUARDED_BY(mu);
  std::map<uint64_t, std::vector<uint8_t>> held ABSL_GUARDED_BY(mu);  // by file offset
};

FollowingSha256::FollowingSha256(std::vector<File> files, uint64_t hold_bytes,
                                 std::function<void(size_t, const std::string&)> on_file)
    : hold_bytes_(hold_bytes), on_file_(std::move(on_file)) {
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
}

FollowingSha256::~FollowingSha256() {
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

void FollowingSha256::Drain(State& s) ABSL_NO_THREAD_SAFETY_ANALYSIS {  // s.mu held
  while (!s.held.empty() && s.held.begin()->first <= s.cursor) {
    auto node = s.held.extract(s.held.begin());
    const uint64_t off = node.key();
    const std::vector<uint8_t>& bytes = node.mapped();
    held_ -= bytes.size();
    if (off + bytes.size() > s.cursor) {
      const uint64_t skip = s.cursor - off;
      WC_CHECK(EVP_DigestUpdate(s.ctx, bytes.data() + skip, bytes.size() - skip) == 1);
      followed_ += bytes.size() - skip;
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

void FollowingSha256::Offer(int fd, uint64_t offset, const void* data, uint64_t n) {
  State* s = Find(fd);
  if (s == nullptr || offset >= s->file.size) return;
  n = std::min(n, s->file.size - offset);
  const auto* bytes = static_cast<const uint8_t*>(data);
  std::string digest;
  bool complete = false;
  {
    MutexLock l(s->mu);
    if (s->done || offset + n <= s->cursor) return;  // hashed already (read twice)
    if (offset <= s->cursor) {
      const uint64_t skip = s->cursor - offset;
      WC_CHECK(EVP_DigestUpdate(s->ctx, bytes + skip, n - skip) == 1);
      followed_ += n - skip;
      s->cursor = offset + n;
      Drain(*s);
      complete = Complete(*s, &digest);
    } else if (held_.fetch_add(n) + n <= hold_bytes_) {
      auto& slot = s->held[offset];
      if (slot.size() < n) {
        held_ -= slot.size();
        slot.assign(bytes, bytes + n);
      } else {
        held_ -= n;
      }
    } else {
      held_ -= n;  // over the bound: left for Finish to read
    }
  }
  if (complete && on_file_) on_file_(s->index, digest);
}

absl::Status FollowingSha256::ReadAhead(State& s, uint64_t end, const std::atomic<bool>* cancel)
    ABSL_NO_THREAD_SAFETY_ANALYSIS {  // s.mu held
  std::vector<uint8_t> buf(std::min<uint64_t>(end - s.cursor, 8ull << 20));
  while (s.cursor < end) {
    if (cancel != nullptr && cancel->load()) {
      return absl::CancelledError(
          absl::StrCat(s.file.path, ": the digest was not finished (the load was stopped)"));
    }
    const uint64_t want = std::min<uint64_t>(buf.size(), end - s.cursor);
    const ssize_t got = ::pread(s.file.fd, buf.data(), want, static_cast<off_t>(s.cursor));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      return absl::DataLossError(absl::StrCat(
          s.file.path, ": read for its SHA-256 at byte ", s.cursor, " of ", s.file.size, ": ",
          got < 0 ? std::strerror(errno) : "the file ended (it was truncated)"));
    }
    WC_CHECK(EVP_DigestUpdate(s.ctx, buf.data(), static_cast<size_t>(got)) == 1);
    reread_ += static_cast<uint64_t>(got);
    s.cursor += static_cast<uint64_t>(got);
  }
  return absl::OkStatus();
}

absl::Status FollowingSha256::Start(size_t i, uint64_t n) {
  State& s = *files_.at(i);
  MutexLock l(s.mu);
  if (s.cursor >= n) return absl::OkStatus();
  return ReadAhead(s, std::min(n, s.file.size), nullptr);
}

absl::Status FollowingSha256::FinishOne(State& s, const std::atomic<bool>* cancel) {
  MutexLock l(s.mu);
  while (!s.done) {
    Drain(s);
    std::string digest;
    if (Complete(s, &digest)) break;
    const uint64_t next = s.held.empty() ? s.file.size : s.held.begin()->first;
    WC_RETURN_IF_ERROR(ReadAhead(s, next, cancel));
    Complete(s, &digest);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> FollowingSha256::Finish(const std::atomic<bool>* cancel,
                                                                 unsigned threads) {
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
