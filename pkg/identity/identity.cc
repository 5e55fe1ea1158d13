#include "pkg/identity/identity.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"
#include "pkg/util/errno_status.h"
#include "pkg/util/log.h"
#include "pkg/util/scoped_fd.h"
#include "pkg/util/status_macros.h"

// Header-only use of libxxhash: nothing to carry to machines without the library.
#define XXH_INLINE_ALL
#include <xxhash.h>

namespace weightcache::identity {
namespace {

constexpr uint64_t kChunkBytes = 64ull << 20;  // one unit of parallel hashing
constexpr uint64_t kReadBytes = 4ull << 20;    // one pread
constexpr int kStoreVersion = 1;
// A node holds a few hundred checkpoint files at most; the store forgets the oldest
// versions past this many so the state file stays small.
constexpr size_t kMaxStoreEntries = 100000;

FileStat FromStat(const struct stat& st) {
  FileStat f;
  f.dev = st.st_dev;
  f.ino = st.st_ino;
  f.size = static_cast<uint64_t>(st.st_size);
  f.mtime_ns = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  f.ctime_ns = static_cast<int64_t>(st.st_ctim.tv_sec) * 1000000000 + st.st_ctim.tv_nsec;
  return f;
}

std::string FormatTime(int64_t ns) {
  const time_t secs = static_cast<time_t>(ns / 1000000000);
  struct tm tm {};
  ::gmtime_r(&secs, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%S", &tm);
  return absl::StrFormat("%s.%09dZ", buf, static_cast<int>(ns % 1000000000));
}

std::string Hex(const XXH128_hash_t& h) {
  XXH128_canonical_t c;
  XXH128_canonicalFromHash(&c, h);
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (unsigned char b : c.digest) {
    out.push_back(kHex[b >> 4]);
    out.push_back(kHex[b & 15]);
  }
  return out;
}

bool IsHex64(const std::string& s) {
  return s.size() == 64 && std::all_of(s.begin(), s.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
         });
}

}  // namespace

absl::StatusOr<FileStat> StatPath(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return ErrnoStatus(errno, "stat", path);
  return FromStat(st);
}

absl::StatusOr<FileStat> StatFd(int fd, const std::string& what) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return ErrnoStatus(errno, "fstat", what);
  return FromStat(st);
}

std::string DescribeChange(const std::string& name, const FileStat& before,
                           const absl::StatusOr<FileStat>& now) {
  if (!now.ok()) {
    if (now.status().code() == absl::StatusCode::kNotFound) return absl::StrCat(name, ": deleted");
    return absl::StrCat(name, ": cannot be checked (", now.status().message(), ")");
  }
  const FileStat& n = *now;
  if (n == before) return "";
  std::vector<std::string> what;
  if (n.dev != before.dev || n.ino != before.ino) {
    what.push_back(
        absl::StrCat("replaced by another file (inode ", before.ino, " -> ", n.ino, ")"));
  }
  if (n.size != before.size) what.push_back(absl::StrCat("size ", before.size, " -> ", n.size));
  if (n.mtime_ns != before.mtime_ns) what.push_back("modified " + FormatTime(n.mtime_ns));
  if (what.empty()) {
    // Same inode, size and mtime: written in place with the mtime set back (touch -d);
    // only the ctime tells.
    what.push_back("rewritten in place (changed " + FormatTime(n.ctime_ns) + ")");
  }
  std::string out = name + ": ";
  for (size_t i = 0; i < what.size(); ++i) absl::StrAppend(&out, i ? ", " : "", what[i]);
  return out;
}

std::optional<std::string> HuggingFaceBlobDigest(const std::string& path) {
  char buf[PATH_MAX];
  if (::realpath(path.c_str(), buf) == nullptr) return std::nullopt;
  const std::string real(buf);
  const size_t slash = real.rfind('/');
  if (slash == std::string::npos || slash < 6) return std::nullopt;
  const std::string base = real.substr(slash + 1);
  if (!IsHex64(base) || real.compare(slash - 6, 6, "/blobs") != 0) return std::nullopt;
  return "sha256:" + base;
}

absl::StatusOr<std::string> HashFile(int fd, uint64_t size, unsigned threads,
                                     const std::string& what, const std::atomic<bool>* cancel) {
  const uint64_t chunks = std::max<uint64_t>(1, (size + kChunkBytes - 1) / kChunkBytes);
  std::vector<XXH128_hash_t> digests(chunks);
  std::vector<absl::Status> errors(chunks);
  std::atomic<uint64_t> next{0};
  auto worker = [&] {
    std::vector<unsigned char> buf(kReadBytes);
    XXH3_state_t* state = XXH3_createState();
    WC_CHECK(state != nullptr);
    for (uint64_t c = next++; c < chunks; c = next++) {
      XXH3_128bits_reset(state);
      const uint64_t begin = c * kChunkBytes;
      const uint64_t end = std::min(size, begin + kChunkBytes);
      for (uint64_t off = begin; off < end;) {
        if (cancel != nullptr && cancel->load()) {
          errors[c] = absl::CancelledError(what + ": hashing stopped (the daemon is stopping)");
          break;
        }
        const size_t want = static_cast<size_t>(std::min<uint64_t>(kReadBytes, end - off));
        const ssize_t n = ::pread(fd, buf.data(), want, static_cast<off_t>(off));
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
          errors[c] = n < 0 ? ErrnoStatus(errno, "pread", what)
                            : absl::DataLossError(absl::StrCat(what, ": ends at byte ", off,
                                                               ", expected ", size, " bytes"));
          break;
        }
        XXH3_128bits_update(state, buf.data(), static_cast<size_t>(n));
        off += static_cast<uint64_t>(n);
      }
      digests[c] = XXH3_128bits_digest(state);
    }
    XXH3_freeState(state);
  };
  const unsigned n = static_cast<unsigned>(std::clamp<uint64_t>(threads, 1, chunks));
  std::vector<std::thread> pool;
  for (unsigned i = 1; i < n; ++i) pool.emplace_back(worker);
  worker();
  for (auto& t : pool) t.join();
  for (const auto& e : errors) WC_RETURN_IF_ERROR(e);
  // Top level: the size (little endian) and every chunk's canonical digest, in order.
  std::string top(8, '\0');
  for (int i = 0; i < 8; ++i) top[i] = static_cast<char>((size >> (8 * i)) & 0xff);
  for (const auto& d : digests) {
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, d);
    top.append(reinterpret_cast<const char*>(c.digest), sizeof(c.digest));
  }
  return "xxh3c:" + Hex(XXH3_128bits(top.data(), top.size()));
}

const char* DigestSourceName(DigestSource s) {
  switch (s) {
    case DigestSource::kBlobName:
      return "blob name";
    case DigestSource::kStore:
      return "digest store";
    case DigestSource::kHashed:
      return "hashed";
  }
  return "unknown";
}

DigestStore::Key DigestStore::KeyOf(const FileStat& st) {
  return {st.dev, st.ino, st.size, st.mtime_ns, st.ctime_ns};
}

absl::StatusOr<std::unique_ptr<DigestStore>> DigestStore::Open(const std::string& path) {
  std::unique_ptr<DigestStore> store(new DigestStore(path));
  if (path.empty()) return store;
  std::ifstream in(path);
  if (!in) {
    if (errno == ENOENT) return store;
    return ErrnoStatus(errno, "open digest store", path);
  }
  std::stringstream ss;
  ss << in.rdbuf();
  try {
    auto j = nlohmann::json::parse(ss.str());
    if (j.at("version").get<int>() != kStoreVersion) {
      throw std::runtime_error("version " + j.at("version").dump());
    }
    MutexLock l(store->mu_);
    for (const auto& e : j.at("entries")) {
      FileStat st;
      st.dev = e.at("dev").get<uint64_t>();
      st.ino = e.at("ino").get<uint64_t>();
      st.size = e.at("size").get<uint64_t>();
      st.mtime_ns = e.at("mtime_ns").get<int64_t>();
      st.ctime_ns = e.at("ctime_ns").get<int64_t>();
      store->digests_[KeyOf(st)] = e.at("digest").get<std::string>();
    }
  } catch (const std::exception& ex) {
    WC_LOG_WARN("digest store %s cannot be read (%s); set aside as %s.bad, starting empty", path,
                ex.what(), path);
    ::rename(path.c_str(), (path + ".bad").c_str());
    MutexLock l(store->mu_);
    store->digests_.clear();
  }
  return store;
}

std::optional<std::string> DigestStore::Lookup(const FileStat& st) const {
  MutexLock l(mu_);
  auto it = digests_.find(KeyOf(st));
  if (it == digests_.end()) return std::nullopt;
  return it->second;
}

size_t DigestStore::size() const {
  MutexLock l(mu_);
  return digests_.size();
}

void DigestStore::Record(const FileStat& st, const std::string& digest) {
  MutexLock l(mu_);
  digests_[KeyOf(st)] = digest;
  while (digests_.size() > kMaxStoreEntries) {
    // The oldest change time goes first.
    auto oldest = std::min_element(
        digests_.begin(), digests_.end(),
        [](const auto& a, const auto& b) { return std::get<4>(a.first) < std::get<4>(b.first); });
    digests_.erase(oldest);
  }
  SaveLocked();
}

void DigestStore::SaveLocked() const {
  if (path_.empty()) return;
  nlohmann::json entries = nlohmann::json::array();
  for (const auto& [k, digest] : digests_) {
    entries.push_back({{"dev", std::get<0>(k)},
                       {"ino", std::get<1>(k)},
                       {"size", std::get<2>(k)},
                       {"mtime_ns", std::get<3>(k)},
                       {"ctime_ns", std::get<4>(k)},
                       {"digest", digest}});
  }
  const std::string text =
      nlohmann::json{{"version", kStoreVersion}, {"entries", entries}}.dump(1) + "\n";
  const std::string tmp = path_ + ".tmp";
  {
    // 0600: inode numbers and digests are nobody else's business.
    ScopedFd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
    size_t done = 0;
    while (fd.valid() && done < text.size()) {
      const ssize_t n = ::write(fd.get(), text.data() + done, text.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      done += static_cast<size_t>(n);
    }
    if (done != text.size()) {
      WC_LOG_WARN(
          "digest store: cannot write %s (%s); digests will be computed again after a "
          "restart",
          tmp, std::strerror(errno));
      return;
    }
  }
  if (::rename(tmp.c_str(), path_.c_str()) != 0) {
    WC_LOG_WARN("digest store: rename %s -> %s failed (%s)", tmp, path_, std::strerror(errno));
  }
}

absl::StatusOr<ResolvedDigest> DigestStore::Resolve(const std::string& path, int fd,
                                                    unsigned threads,
                                                    const std::atomic<bool>* cancel) {
  ResolvedDigest r;
  WC_ASSIGN_OR_RETURN(r.stat, StatFd(fd, path));
  if (auto blob = HuggingFaceBlobDigest(path)) {
    r.digest = *blob;
    r.source = DigestSource::kBlobName;
    return r;
  }
  if (auto known = Lookup(r.stat)) {
    r.digest = *known;
    r.source = DigestSource::kStore;
    return r;
  }
  WC_ASSIGN_OR_RETURN(r.digest, HashFile(fd, r.stat.size, threads, path, cancel));
  hashed_bytes_ += r.stat.size;
  WC_ASSIGN_OR_RETURN(FileStat after, StatFd(fd, path));
  if (!(after == r.stat)) {
    return absl::UnavailableError(absl::StrCat(
        "content digest of ", path, " not taken: ", DescribeChange(path, r.stat, after),
        " while it was hashed; try again once it is written"));
  }
  r.source = DigestSource::kHashed;
  Record(r.stat, r.digest);
  return r;
}

}  // namespace weightcache::identity
