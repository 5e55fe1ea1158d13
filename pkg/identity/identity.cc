#include "pkg/identity/identity.h"

#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
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
#include "pkg/identity/internal/sha256.h"
#include "pkg/util/bytes.h"
#include "pkg/util/errno_status.h"
#include "pkg/util/log.h"
#include "pkg/util/scoped_fd.h"
#include "pkg/util/status_macros.h"

namespace weightcache::identity {
namespace {

constexpr uint64_t kChunkBytes = 64ull << 20;  // one unit of parallel hashing
constexpr uint64_t kReadBytes = 4ull << 20;    // one pread
// 2: the entries carry an HMAC-SHA256 under the daemon's key (issue 25); a version 1 store
// has none and is discarded like a tampered one.
constexpr int kStoreVersion = 2;
constexpr size_t kKeyBytes = 32;
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

using internal::Sha256;

// Reads [begin, end) of `fd` in kReadBytes preads into `h`; CANCELLED when `cancel` turns
// true, DATA_LOSS when the file ends early.
absl::Status ReadInto(int fd, uint64_t begin, uint64_t end, std::vector<unsigned char>& buf,
                      Sha256& h, uint64_t size, const std::string& what,
                      const std::atomic<bool>* cancel) {
  for (uint64_t off = begin; off < end;) {
    if (cancel != nullptr && cancel->load()) {
      return absl::CancelledError(what + ": hashing stopped (the daemon is stopping)");
    }
    const size_t want = static_cast<size_t>(std::min<uint64_t>(kReadBytes, end - off));
    const ssize_t n = ::pread(fd, buf.data(), want, static_cast<off_t>(off));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      return n < 0 ? ErrnoStatus(errno, "pread", what)
                   : absl::DataLossError(
                         absl::StrCat(what, ": ends at byte ", off, ", expected ", size, " bytes"));
    }
    h.Update(buf.data(), static_cast<size_t>(n));
    off += static_cast<uint64_t>(n);
  }
  return absl::OkStatus();
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
  std::vector<std::array<unsigned char, 32>> digests(chunks);
  std::vector<absl::Status> errors(chunks);
  std::atomic<uint64_t> next{0};
  auto worker = [&] {
    std::vector<unsigned char> buf(kReadBytes);
    Sha256 h;
    for (uint64_t c = next++; c < chunks; c = next++) {
      h.Reset();
      const uint64_t begin = c * kChunkBytes;
      errors[c] =
          ReadInto(fd, begin, std::min(size, begin + kChunkBytes), buf, h, size, what, cancel);
      if (!errors[c].ok()) break;
      digests[c] = h.Final();
    }
  };
  const unsigned n = static_cast<unsigned>(std::clamp<uint64_t>(threads, 1, chunks));
  std::vector<std::thread> pool;
  for (unsigned i = 1; i < n; ++i) pool.emplace_back(worker);
  worker();
  for (auto& t : pool) t.join();
  for (const auto& e : errors) WC_RETURN_IF_ERROR(e);
  // Top level: the size (little endian) and every chunk's digest, in order.
  Sha256 top;
  unsigned char le[8];
  for (int i = 0; i < 8; ++i) le[i] = static_cast<unsigned char>((size >> (8 * i)) & 0xff);
  top.Update(le, sizeof le);
  for (const auto& d : digests) top.Update(d.data(), d.size());
  const auto d = top.Final();
  return "sha256c:" + HexEncode(d.data(), d.size());
}

std::string Sha256Hex(std::string_view data) {
  Sha256 h;
  h.Update(data.data(), data.size());
  return h.HexFinal();
}

const char* DigestSourceName(DigestSource s) {
  switch (s) {
    case DigestSource::kBlobName:
      return "blob name";
    case DigestSource::kStore:
      return "digest store";
    case DigestSource::kHashed:
      return "hashed";
    case DigestSource::kPinned:
      return "pinned";
  }
  return "unknown";
}

DigestStore::Key DigestStore::KeyOf(const FileStat& st) {
  return {st.dev, st.ino, st.size, st.mtime_ns, st.ctime_ns};
}

namespace {

// The store's key, `<store>.key`: 32 random bytes, mode 0600, owned by this uid. Created
// when missing; a key that another uid owns or may read is no secret and is replaced (the
// store it signed is then discarded: its entries cannot be told from forgeries).
absl::StatusOr<std::string> StoreKey(const std::string& store_path) {
  const std::string path = store_path + ".key";
  ScopedFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
  if (fd.valid()) {
    struct stat st {};
    std::string key(kKeyBytes, '\0');
    ssize_t n = -1;
    if (::fstat(fd.get(), &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == ::geteuid() &&
        (st.st_mode & 077) == 0) {
      n = ::pread(fd.get(), key.data(), key.size(), 0);
    }
    if (n == static_cast<ssize_t>(kKeyBytes) && st.st_size == static_cast<off_t>(kKeyBytes)) {
      return key;
    }
    WC_LOG_WARN(
        "digest store key %s is not a %zu-byte file private to uid %d (mode %o, owner %d); "
        "replacing it",
        path, kKeyBytes, static_cast<int>(::geteuid()), st.st_mode & 07777,
        static_cast<int>(st.st_uid));
    if (::unlink(path.c_str()) != 0) return ErrnoStatus(errno, "replace digest store key", path);
  } else if (errno != ENOENT) {
    return ErrnoStatus(errno, "open digest store key", path);
  }
  std::string key(kKeyBytes, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(key.data()), static_cast<int>(key.size())) != 1) {
    return absl::InternalError("digest store key: RAND_bytes failed");
  }
  ScopedFd out(::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (!out.valid()) return ErrnoStatus(errno, "create digest store key", path);
  if (::write(out.get(), key.data(), key.size()) != static_cast<ssize_t>(key.size()) ||
      ::fsync(out.get()) != 0) {
    return ErrnoStatus(errno, "write digest store key", path);
  }
  return key;
}

std::string Hmac(const std::string& key, const std::string& text) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
       reinterpret_cast<const unsigned char*>(text.data()), text.size(), md, &len);
  return HexEncode(md, len);
}

bool SameMac(const std::string& a, const std::string& b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

}  // namespace

absl::StatusOr<std::unique_ptr<DigestStore>> DigestStore::Open(const std::string& path) {
  if (path.empty()) return std::unique_ptr<DigestStore>(new DigestStore(path, ""));
  WC_ASSIGN_OR_RETURN(std::string key, StoreKey(path));
  std::unique_ptr<DigestStore> store(new DigestStore(path, std::move(key)));
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
      throw std::runtime_error("version " + j.at("version").dump() + ", not " +
                               std::to_string(kStoreVersion));
    }
    const auto& entries = j.at("entries");
    if (!j.contains("hmac") ||
        !SameMac(j.at("hmac").get<std::string>(), Hmac(store->key_, entries.dump()))) {
      throw std::runtime_error(
          "its HMAC does not match this daemon's key: tampered, or written with another key");
    }
    MutexLock l(store->mu_);
    for (const auto& e : entries) {
      FileStat st;
      st.dev = e.at("dev").get<uint64_t>();
      st.ino = e.at("ino").get<uint64_t>();
      st.size = e.at("size").get<uint64_t>();
      st.mtime_ns = e.at("mtime_ns").get<int64_t>();
      st.ctime_ns = e.at("ctime_ns").get<int64_t>();
      store->digests_[KeyOf(st)] = e.at("digest").get<std::string>();
    }
  } catch (const std::exception& ex) {
    WC_LOG_WARN(
        "digest store %s discarded (%s); set aside as %s.bad, starting empty: files are hashed "
        "again",
        path, ex.what(), path);
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
  const std::string mac = Hmac(key_, entries.dump());
  const std::string text =
      nlohmann::json{{"version", kStoreVersion}, {"entries", entries}, {"hmac", mac}}.dump(1) +
      "\n";
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

namespace {

// What the store hands out without reading: a plain SHA-256. "sha256c:" (issue 25 to 48) and
// "xxh3c:" (before) entries are computed again.
bool IsCurrentKind(const std::string& digest) { return digest.rfind("sha256:", 0) == 0; }

// UNAVAILABLE when the file is no longer the version `before` (written while hashed).
absl::Status Unchanged(int fd, const std::string& path, const FileStat& before) {
  WC_ASSIGN_OR_RETURN(FileStat after, StatFd(fd, path));
  if (after == before) return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat("content digest of ", path,
                                             " not taken: ", DescribeChange(path, before, after),
                                             " while it was hashed; try again once it is written"));
}

}  // namespace

absl::StatusOr<ResolvedDigest> DigestStore::Resolve(const std::string& path, int fd,
                                                    const std::atomic<bool>* cancel) {
  ResolvedDigest r;
  WC_ASSIGN_OR_RETURN(r.stat, StatFd(fd, path));
  // The store first: it holds only digests this daemon computed from the bytes (a blob
  // name it verified included). Digests of an earlier kind are hashed again.
  if (auto known = Lookup(r.stat); known && IsCurrentKind(*known)) {
    r.digest = *known;
    r.source = DigestSource::kStore;
    return r;
  }
  // A Hugging Face blob's name is a hint, never proof: whoever writes a model directory can
  // name any bytes after another model's blob (issue 25). Its SHA-256 is verified here, once
  // per file version (the store remembers it).
  if (auto blob = HuggingFaceBlobDigest(path)) {
    WC_ASSIGN_OR_RETURN(const std::string sha, Sha256File(fd, r.stat.size, path, cancel));
    hashed_bytes_ += r.stat.size;
    if ("sha256:" + sha != *blob) {
      return absl::DataLossError(absl::StrCat(
          path, ": its Hugging Face blob name says ", *blob, " but its contents hash to sha256:",
          sha, "; refused (a blob whose name does not match its bytes is not that blob)"));
    }
    WC_RETURN_IF_ERROR(Unchanged(fd, path, r.stat));
    r.digest = *blob;
    r.source = DigestSource::kBlobName;
    Record(r.stat, r.digest);
    return r;
  }
  // One sequential SHA-256 (about 1 GB/s a core; OpenModel hashes a checkpoint's files side
  // by side): the digest a spec pins and a Hugging Face blob is named by, so a node that
  // hashed and one that was told agree on the fingerprint.
  WC_ASSIGN_OR_RETURN(const std::string sha, Sha256File(fd, r.stat.size, path, cancel));
  hashed_bytes_ += r.stat.size;
  r.digest = "sha256:" + sha;
  WC_RETURN_IF_ERROR(Unchanged(fd, path, r.stat));
  r.source = DigestSource::kHashed;
  Record(r.stat, r.digest);
  return r;
}

}  // namespace weightcache::identity
