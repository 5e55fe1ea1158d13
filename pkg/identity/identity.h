// Weights identity by content. A checkpoint file is identified by the SHA-256 of its bytes
// ("sha256:<64 hex>"), never by its name, header or size alone (a base model and its
// fine-tune have identical headers). The digest comes, cheapest first, from:
//   0. the spec's pinned `digests:` (spec.h): the admin's word, taken without reading the
//      file; the loader checks it against the bytes whenever it reads them (load::LoadRank);
//   1. the DigestStore: digests this daemon computed earlier from the bytes, keyed by the
//      file version they were computed from (device, inode, size, mtime_ns, ctime_ns), kept
//      in a small state file so a daemon restart does not hash again;
//   2. a Hugging Face cache blob: snapshot files are links to blobs/<sha256 of the contents>,
//      so the link target's name is the digest -- a claim that whoever wrote the file chose,
//      so it is verified (SHA-256 of the file) before it is used;
//   3. hashing the file (one sequential SHA-256: the same digest as 1 and 2, and as the one
//      a spec pins, so every node names the same bytes alike however it learnt the digest).
// Every digest is cryptographic: the identity is shared across tenants, and a writer of a
// file must not be able to give it another file's digest.
// A FileStat taken when the digest was resolved tells later whether the file changed
// (replaced, rewritten in place, truncated, deleted): a few stat() calls, no reads.
//
// Thread-safety: the free functions are pure or read only their arguments; DigestStore may
// be used from any thread. Lifetimes: a DigestStore outlives the calls that use it.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "pkg/util/mutex.h"

namespace weightcache::identity {

// The version of a file that a digest describes. Any write changes ctime (which no user
// can set back), a replacement changes the inode, so equal stats mean equal contents.
struct FileStat {
  uint64_t dev = 0;
  uint64_t ino = 0;
  uint64_t size = 0;
  int64_t mtime_ns = 0;
  int64_t ctime_ns = 0;
  bool operator==(const FileStat&) const = default;
};

// stat(2) of `path` (links followed); NOT_FOUND when it is gone.
absl::StatusOr<FileStat> StatPath(const std::string& path);
absl::StatusOr<FileStat> StatFd(int fd, const std::string& what);

// What changed between `before` and `now` for a user: "model.safetensors: size 123 -> 456,
// modified 2026-12-01T10:00:00.123456789Z" / "...: replaced by another file (inode 12 -> 34)"
// / "...: rewritten in place (changed 2026-...)" / "...: deleted". Empty when equal.
std::string DescribeChange(const std::string& name, const FileStat& before,
                           const absl::StatusOr<FileStat>& now);

// "sha256:<hex>" when `path` resolves (through links) to a file named by 64 hex digits in a
// directory named "blobs" (the Hugging Face hub cache layout); nullopt otherwise.
std::optional<std::string> HuggingFaceBlobDigest(const std::string& path);

// Hashes `size` bytes of `fd` from offset 0 with up to `threads` parallel preads:
// "sha256c:<64 hex>" (SHA-256 of 64 MiB chunks, then of the size and the chunk digests).
// Identities used it before issue 48 (a digest no one outside the daemon computes, so a spec
// could not pin it); the store no longer trusts it, bench/digest_bench compares the costs.
// `what` names the file in errors. When `cancel` is set and becomes true,
// stops within one 4 MiB read with CANCELLED.
absl::StatusOr<std::string> HashFile(int fd, uint64_t size, unsigned threads,
                                     const std::string& what,
                                     const std::atomic<bool>* cancel = nullptr);

// The plain SHA-256 of `size` bytes of `fd`: "<64 hex>", what a Hugging Face blob is named by.
// One hash (sequential) on the calling thread; past 8 MiB, three reader threads read ahead of
// it through the page cache, at most 48 MiB (sha256_file.cc). Errors and `cancel` as for
// HashFile (it stops within one 8 MiB read).
absl::StatusOr<std::string> Sha256File(int fd, uint64_t size, const std::string& what,
                                       const std::atomic<bool>* cancel = nullptr);

// The plain SHA-256 of `data`: "<64 hex>".
std::string Sha256Hex(std::string_view data);

// kBlobName: verified; kPinned: the spec's `digests:`, not read (yet) on this node.
enum class DigestSource { kBlobName, kStore, kHashed, kPinned };
const char* DigestSourceName(DigestSource s);

struct ResolvedDigest {
  std::string digest;
  FileStat stat;  // the version the digest describes (fstat of `fd`)
  DigestSource source = DigestSource::kHashed;
};

// Digests remembered per file version, persisted as JSON in `path` (empty: memory only).
class DigestStore {
 public:
  // Reads `path` when it exists. The entries are authenticated with an HMAC-SHA256 under a
  // key only this daemon's uid can read (`<path>.key`, 0600, made on first use): whoever can
  // write the store but not read the key cannot assign a digest to a file version. A file
  // that cannot be parsed or fails the HMAC is set aside as `<path>.bad` with a warning and
  // the store starts empty (it is a cache: nothing is lost but time).
  static absl::StatusOr<std::unique_ptr<DigestStore>> Open(const std::string& path);
  DigestStore(const DigestStore&) = delete;
  DigestStore& operator=(const DigestStore&) = delete;

  std::optional<std::string> Lookup(const FileStat& st) const;
  // Remembers and persists (write to a temporary file, then rename). A failed write is
  // logged, not returned: the digest is still right, only a restart would hash again.
  void Record(const FileStat& st, const std::string& digest);

  // The content digest of the open file `fd` (at `path`), "sha256:<hex>": store, verified
  // blob name, or hashing. UNAVAILABLE when the file changed while it was hashed; DATA_LOSS
  // when a blob's name does not match its bytes. A store entry of the older "sha256c:" kind
  // is hashed again (once per file version).
  absl::StatusOr<ResolvedDigest> Resolve(const std::string& path, int fd,
                                         const std::atomic<bool>* cancel = nullptr);

  // Bytes hashed for this store's files since it was opened: read by Resolve(), or hashed
  // elsewhere from bytes read anyway and counted with CountHashed (a pin check following a
  // load's reads).
  uint64_t hashed_bytes() const { return hashed_bytes_.load(); }
  void CountHashed(uint64_t n) { hashed_bytes_ += n; }
  size_t size() const;
  const std::string& path() const { return path_; }

 private:
  using Key = std::tuple<uint64_t, uint64_t, uint64_t, int64_t, int64_t>;
  static Key KeyOf(const FileStat& st);
  DigestStore(std::string path, std::string key) : path_(std::move(path)), key_(std::move(key)) {}
  void SaveLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string path_;
  const std::string key_;  // HMAC key; empty for a memory-only store
  mutable Mutex mu_;
  std::map<Key, std::string> digests_ ABSL_GUARDED_BY(mu_);
  std::atomic<uint64_t> hashed_bytes_{0};
};

}  // namespace weightcache::identity
