// Compile artifacts (issue 29): immutable blobs an engine publishes under a key that names
// everything that makes them valid (kind, model fingerprint, engine/torch/Triton/CUDA
// versions, compute capability, a hash of the compile settings), served to later engines as
// sealed read-only memfds (zero-copy). Host memory under a budget of its own, evicted least
// recently used; optionally written through to a directory on the node so they survive a
// restart or a reboot. Knows nothing of gRPC or of who may put or get: the daemon decides
// that (pkg/server/artifacts.cc) before it calls in.
//
// Memory: every put in flight reserves its declared size against the budget when it begins,
// so resident bytes plus reservations never exceed it (issue 47: eight puts that declared
// 60 MiB each and trickled their bytes held 472 MiB against a 100 MiB budget), and a put
// holds at most what it reserved. The directory (when used) has a budget of its own, its
// least recently used blobs removed past it, and is read through regular files only.
//
// Single flight: one put per key at a time. A second put of a key in flight is refused
// (ABORTED: wait with Get, or compile too and put later, which then finds it stored); a put
// whose writer goes away before Commit leaves nothing, so no reader ever sees a torn blob.
//
// Thread-safety: every method may be called from any thread. Lifetimes: a PutSlot must not
// outlive its Store; an Artifact (shared_ptr) may (its descriptor stays valid).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "pkg/util/mutex.h"
#include "pkg/util/scoped_fd.h"

namespace weightcache::artifact {

// What an artifact is valid for. Every field takes part in its id; `tenant` is never the
// client's to choose (the daemon sets the private copy's namespace, spec isolation: namespace).
struct Key {
  std::string kind;         // e.g. "torch-compile", "triton-cache", "dir:flashinfer"
  std::string model;        // the spec name the artifact belongs to (its access rules)
  std::string fingerprint;  // the model's weights fingerprint the engine mapped
  std::string engine;
  std::string engine_version;
  std::string torch_version;
  std::string triton_version;
  std::string cuda_version;
  std::string compute_capability;  // "9.0"
  std::string settings_hash;       // the engine's compile settings, hashed by the engine
  std::string tenant;
  bool operator==(const Key&) const = default;
};

// Kinds the engine loads as native code (dlopen: an AOTInductor package's shared object).
// Such an artifact runs inside every engine that gets it, so who put it matters more than
// for a cache the engine reads: the daemon takes it only from admins and the publishers the
// model's spec names for native code (spec `native_publishers:`), and serves only those.
inline bool IsNativeCode(std::string_view kind) { return kind == "aoti-package"; }

// INVALID_ARGUMENT naming the field: kind, model and fingerprint are required; every field
// at most 256 bytes of printable ASCII without spaces (they appear in status and logs).
absl::Status ValidateKey(const Key& key);
// The artifact's id: "art-" + SHA-256 (hex) over the fields, each length-prefixed.
std::string IdOf(const Key& key);

struct Publisher {
  pid_t pid = 0;
  uid_t uid = 0;
  std::string slot;  // the slot socket it came in on (namespace rules), else empty
  double unix_seconds = 0;
  // Put through the admin's door (the daemon says so): with namespace rules, only such an
  // artifact outside a namespace's pool is served to pods (records before issue 47 say false).
  bool admin = false;
};

// A stored artifact: a sealed memfd (no write, grow or shrink, ever) and what describes it.
class Artifact {
 public:
  Artifact(ScopedFd fd, Key key, std::string id, uint64_t bytes, std::string sha256,
           Publisher publisher)
      : fd_(std::move(fd)),
        key_(std::move(key)),
        id_(std::move(id)),
        bytes_(bytes),
        sha256_(std::move(sha256)),
        publisher_(std::move(publisher)) {}
  int fd() const { return fd_.get(); }  // read-only descriptor of the sealed memfd
  const Key& key() const { return key_; }
  const std::string& id() const { return id_; }
  uint64_t bytes() const { return bytes_; }
  const std::string& sha256() const { return sha256_; }  // "<64 hex>"
  const Publisher& publisher() const { return publisher_; }

 private:
  ScopedFd fd_;
  Key key_;
  std::string id_;
  uint64_t bytes_;
  std::string sha256_;
  Publisher publisher_;
};

// What describes an artifact apart from its bytes: written beside its blob in
// --artifact_dir and deposited with the keeper beside its descriptor (JSON, format 1).
struct Record {
  std::string id;
  Key key;
  uint64_t bytes = 0;
  std::string sha256;
  Publisher publisher;
};
std::string EncodeRecord(const Artifact& a);
// INVALID_ARGUMENT naming what is wrong: not JSON, another format, a missing field, a bad
// key, an id that is not its key's, no bytes or no digest.
absl::StatusOr<Record> DecodeRecord(std::string_view json);

struct StoreOptions {
  uint64_t budget_bytes = 1ull << 30;        // host memory for all artifacts; 0: none stored
  uint64_t max_artifact_bytes = 1ull << 30;  // one blob
  std::string dir;  // write-through directory (0700, made if missing); empty: memory only
  // Bytes of blobs the directory may hold (0: no limit); past it the least recently used
  // (put or got; across restarts by the metadata file's mtime) are removed from it.
  uint64_t dir_budget_bytes = 0;
};

class Store;

// One put in progress: bytes are appended to a private memfd; Commit seals and stores it.
// Destroyed before Commit: nothing is stored and the key is free again.
class PutSlot {
 public:
  ~PutSlot();
  PutSlot(const PutSlot&) = delete;
  PutSlot& operator=(const PutSlot&) = delete;
  // INVALID_ARGUMENT past the declared size.
  absl::Status Append(std::string_view data);
  // FAILED_PRECONDITION unless exactly the declared size was appended; RESOURCE_EXHAUSTED
  // when it cannot fit the budget even with every other artifact evicted.
  absl::StatusOr<std::shared_ptr<const Artifact>> Commit(const Publisher& publisher);
  const std::string& id() const { return id_; }

 private:
  friend class Store;
  PutSlot(Store* store, Key key, std::string id, uint64_t size, ScopedFd fd);
  Store* const store_;
  const Key key_;
  const std::string id_;
  const uint64_t size_;
  uint64_t written_ = 0;
  ScopedFd fd_;
  bool done_ = false;
};

struct ArtifactInfo {
  std::shared_ptr<const Artifact> artifact;  // null when only on disk
  std::string id;
  Key key;
  uint64_t bytes = 0;
  std::string sha256;
  Publisher publisher;
  bool resident = false;    // in memory
  bool on_disk = false;     // in the directory
  double idle_seconds = 0;  // since the last get or put (resident only)
};

struct Usage {
  uint64_t resident_bytes = 0;
  uint64_t budget_bytes = 0;
  uint64_t resident = 0;
  uint64_t on_disk = 0;
  uint64_t evictions = 0;  // dropped from memory for the budget since start
  uint64_t puts_in_flight = 0;
  uint64_t reserved_bytes = 0;  // declared by the puts in flight; resident + reserved <= budget
  uint64_t disk_bytes = 0;      // blobs in the directory
  uint64_t dir_budget_bytes = 0;
  uint64_t dir_evictions = 0;  // removed from the directory for its budget since start
};

class Store {
 public:
  // Indexes the directory's artifacts (their metadata; bytes are read and checked against
  // their SHA-256 when first asked for). A file that cannot be parsed is left in place and
  // skipped with a warning naming it.
  static absl::StatusOr<std::unique_ptr<Store>> Open(StoreOptions options);
  ~Store();
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  // ALREADY_EXISTS when stored, ABORTED when another put of the key is in flight,
  // INVALID_ARGUMENT for a bad key or a size over max_artifact_bytes (or 0),
  // RESOURCE_EXHAUSTED (naming the budget and the reservations) when `size` does not fit
  // beside the other puts' reservations. On success `size` bytes are reserved until the slot
  // commits or is destroyed; resident artifacts are dropped, least recently used first, to
  // keep resident + reserved within the budget.
  absl::StatusOr<std::unique_ptr<PutSlot>> BeginPut(const Key& key, uint64_t size);
  // NOT_FOUND when absent. With `wait`, a put in flight is waited for until `deadline` or
  // until `gone` says the asker left. Reading a spilled one back never blocks on the file:
  // DATA_LOSS naming the blob when it is not a regular file (a symlink, a FIFO, a directory),
  // its size is not its record's, or its bytes no longer match their digest (the files are
  // then renamed *.bad and leave the index).
  absl::StatusOr<std::shared_ptr<const Artifact>> Get(
      const Key& key, bool wait = false, std::chrono::steady_clock::time_point deadline = {},
      const std::function<bool()>& gone = nullptr);
  // Drops it from memory and the directory; false when unknown. Readers keep their mapping.
  bool Evict(const std::string& id);
  std::vector<ArtifactInfo> List() const;
  // The artifact held in memory under `id` (null when not), without counting it as a use.
  std::shared_ptr<const Artifact> InMemory(const std::string& id) const;
  std::vector<std::shared_ptr<const Artifact>> ResidentArtifacts() const;

  // Takes an artifact back from the keeper after a daemon restart: `fd` must be a sealed
  // memfd (no write, grow or shrink) of the record's size whose bytes hash to the record's
  // SHA-256; FAILED_PRECONDITION or DATA_LOSS naming the id otherwise, ALREADY_EXISTS when
  // held. Counts against the budget like a put (RESOURCE_EXHAUSTED when it cannot fit).
  absl::StatusOr<std::shared_ptr<const Artifact>> Adopt(ScopedFd fd, const Record& record);

  // Called with an artifact's id whenever it comes into memory or leaves it (put, read back,
  // adopted, dropped for the budget, evicted), without the store's lock held: the keeper
  // link's cue. Set before the store is shared.
  void SetObserver(std::function<void(const std::string& id)> changed);
  Usage usage() const;
  const StoreOptions& options() const { return options_; }

 private:
  friend class PutSlot;
  explicit Store(StoreOptions options) : options_(std::move(options)) {}
  struct Resident {
    std::shared_ptr<const Artifact> artifact;
    std::chrono::steady_clock::time_point used;
  };
  struct Spilled {
    Key key;
    uint64_t bytes = 0;
    std::string sha256;
    Publisher publisher;
    std::chrono::system_clock::time_point used;  // last put or get (the directory's LRU)
  };
  absl::Status IndexDir();
  // Removes the directory's least recently used blobs (never `keep`), files included, until
  // `incoming` more bytes fit its budget, then counts `incoming` as on disk; the ids removed.
  std::vector<std::string> MakeDirRoom(uint64_t incoming, const std::string& keep)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void UnlinkFiles(const std::vector<std::string>& ids) const;
  // A get of `id`: the directory's LRU order, and its metadata file's mtime (across restarts).
  void TouchOnDisk(const std::string& id);
  // Drops resident artifacts, least recently used first, until resident + reserved +
  // `incoming` fit the budget (or none is left); their ids into `dropped`.
  void DropResident(uint64_t incoming, std::vector<std::string>* dropped)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Makes `a` resident; RESOURCE_EXHAUSTED when the reservations leave it no room.
  // `dropped`: the ids that left memory to make room (to notify once the lock is released).
  absl::Status Insert(std::shared_ptr<const Artifact> a, std::vector<std::string>* dropped)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Notify(const std::vector<std::string>& ids) const;
  void Spill(const Artifact& a);
  absl::StatusOr<std::shared_ptr<const Artifact>> ReadSpilled(const std::string& id,
                                                              const Spilled& s);
  // A put that ends uncommitted: the key is free again and its reservation released.
  void EndPut(const std::string& id, uint64_t reserved);

  const StoreOptions options_;
  mutable Mutex mu_;
  CondVar cv_;
  std::map<std::string, Resident> resident_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Spilled> spilled_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> putting_ ABSL_GUARDED_BY(mu_);
  std::function<void(const std::string&)> changed_;
  uint64_t resident_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t reserved_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t disk_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t evictions_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t dir_evictions_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace weightcache::artifact
