// The registry: cache entries keyed by (fingerprint, device UUID), their state machine,
// single-flight loading, leases, and the memory budget (per device).
//
// The fingerprint says WHAT the bytes are (model, layout, quantization, environment); the
// device says WHERE they are resident ("GPU-..." or "host"). The same model-rank may be
// resident on two GPUs of a node at once (e.g. loaded on one, peer-copied to another):
// those are two entries with one fingerprint.
//
//   loading ──► ready ──► evicting ──► gone
//      └──────► failed(error)   └──► draining ──► gone (when its last lease ends)
//
// An entry evicted while clients hold leases on it is `draining`: out of the lookup maps (a
// new load of the same key may start), the registry's reference to its memory dropped (it is
// freed when the last client unmaps it), but still listed by Snapshot() with its leases and
// bytes and still counted against its device's budget, until its last lease ends. An entry
// whose memory changed after it was sealed (integrity, issue 27) is evicted the same way and
// marked corrupt: never served again, freed when its last lease ends. A ready entry may
// also be marked stale (its files changed on disk): it keeps serving only callers whose own files
// still match (the daemon decides).
//
// Single flight: StartOrJoin for a key that is loading or ready returns that entry; only the first
// caller's load function runs (on a registry-owned thread). Evicting drops the registry's reference
// to the segments only: clients that still map the memory keep it valid (the kernel / driver count
// references).
//
// Thread-safety: every method may be called from any thread. Entry fields other than the
// immutable identity are guarded by the registry's mutex and read through Snapshot().
// Lifetimes: the Registry must outlive every load it started (its destructor joins them).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "pkg/integrity/digest.h"
#include "pkg/load/loader.h"
#include "pkg/load/model.h"
#include "pkg/spec/fingerprint.h"
#include "pkg/util/mutex.h"

namespace weightcache::cache {

enum class State { kLoading, kReady, kEvicting, kGone, kFailed, kDraining };
const char* StateName(State s);

// Where an entry lives in the registry.
struct Key {
  std::string fingerprint;
  std::string device_uuid;                       // "GPU-..." or a host backend device ("host")
  auto operator<=>(const Key&) const = default;  // NOLINT(modernize-use-nullptr): tidy 14 bug
  std::string ToString() const;                  // "<fingerprint[:12]>@<device>"
};

struct LeaseRecord {
  std::string id;
  int pid = 0;  // the process holding the descriptors (set when claimed)
  int uid = 0;
  std::chrono::steady_clock::time_point since;
  int owner_uid = -1;    // the uid that acquired it (for Status and messages)
  bool claimed = false;  // its descriptors were handed out (SetLeasePeer)
  std::string slot;      // the slot socket it was acquired on; empty: the shared one
  // The tenant unit that acquired it (tenant::Unit::Key: "pod:<uid>", "slot:<id>",
  // "process:<pid>/<start>"): only that unit, or an admin, may release it.
  std::string owner_unit;
  std::string owner_pod;  // "<namespace>/<name>" when the kubelet named the pod; else empty
};

// Checks a fill's digests against what they must be (a peer copy: its source's; a keeper
// adoption: the digests recorded at its deposit); an error fails the fill.
using DigestCheckFn = std::function<absl::Status(const std::vector<integrity::SegmentDigest>&)>;
using TakenDigestsFn = std::function<std::vector<integrity::SegmentDigest>()>;

// Immutable identity plus guarded state of one model-rank on one device. The identity and
// `progress` may be read from any thread; the state is the registry's, behind its mutex,
// and read through Registry::StateOf() / Snapshot() / WaitReady().
class Entry {
 public:
  Entry(Key k, std::string model, spec::FingerprintInputs in, std::string source,
        std::vector<load::SourceFile> files = {})
      : key(std::move(k)),
        fingerprint(key.fingerprint),
        device_uuid(key.device_uuid),
        model(std::move(model)),
        inputs(std::move(in)),
        source(std::move(source)),
        files(std::move(files)) {}
  const Key key;
  const std::string fingerprint;  // key.fingerprint
  const std::string device_uuid;  // key.device_uuid
  const std::string model;
  const spec::FingerprintInputs inputs;
  const std::string source;  // how it was filled: "disk" | "peer" (copied from another device)
  // The checkpoint files (and their versions) the bytes came from: a later change makes the
  // entry stale for callers that ask by fingerprint.
  const std::vector<load::SourceFile> files;
  load::LoadProgress progress;  // safe to read without the lock; Cancel() stops the load

 private:
  friend class Registry;
  // Guarded by Registry::mu_ (an annotation cannot name another object's mutex).
  State state = State::kLoading;
  absl::Status error;
  std::shared_ptr<const load::LoadedModel> loaded;  // set when ready
  std::map<std::string, LeaseRecord> leases;
  std::chrono::steady_clock::time_point started = std::chrono::steady_clock::now();
  double load_seconds = 0;
  uint64_t reserved_bytes = 0;  // counted against the budget while loading/ready/draining
  std::chrono::steady_clock::time_point last_used = std::chrono::steady_clock::now();
  std::string stale;  // non-empty: what changed on disk since it was loaded
  // One digest per segment of `loaded`, taken before it became ready (SetDigester).
  std::shared_ptr<const std::vector<integrity::SegmentDigest>> digests;
  std::chrono::steady_clock::time_point verified_at;  // digest taken or last matched
  std::string corrupt;           // non-empty: what changed in memory after it was sealed
  DigestCheckFn check_digests;   // LoadRequest::check_digests
  TakenDigestsFn taken_digests;  // LoadRequest::taken_digests
  // While draining and not corrupt: the content its lease holders still map, kept so the
  // scrubber goes on checking it (issue 48); dropped with its last lease or when found corrupt.
  std::shared_ptr<const load::LoadedModel> watched;
};

struct EntrySnapshot {
  std::string fingerprint;
  std::string source;
  std::string model;
  spec::FingerprintInputs inputs;
  State state;
  std::string error;
  std::string stale;    // what changed on disk; empty when the files are as loaded
  std::string corrupt;  // what changed in memory; empty unless marked corrupt
  // Seconds since its digests were taken or last matched in full; -1 without digests.
  double verified_seconds_ago = -1;
  // Each segment's cryptographic digest taken at its fill (32 raw bytes each); empty without.
  std::vector<std::string> segment_sha256;
  uint64_t bytes = 0;         // resident (allocated)
  uint64_t tensor_bytes = 0;  // the tensors' own bytes
  uint64_t bytes_done = 0;
  uint64_t bytes_total = 0;
  std::string current_file;
  std::string device_uuid;  // the entry's device (also while loading)
  size_t tensors = 0;
  size_t segments = 0;
  double load_seconds = 0;
  uint64_t bytes_read = 0;  // by the load (LoadStats::bytes_read)
  std::vector<LeaseRecord> leases;
};

// What a load produces; run on a registry thread. May call Entry::progress.
using LoadFn = std::function<absl::StatusOr<std::unique_ptr<load::LoadedModel>>(Entry&)>;
// The digests of a load's sealed segments, one per segment in order; run on the load's
// thread before the entry becomes ready (an error fails the load).
using DigestFn = std::function<absl::StatusOr<std::vector<integrity::SegmentDigest>>(
    const Entry&, const load::LoadedModel&)>;
// Called when a load ends (ready or failed), outside the lock.
using LoadDoneFn = std::function<void(const Entry&, const absl::Status&, double seconds)>;

// What StartOrJoin starts when the key has no live entry.
struct LoadRequest {
  Key key;
  std::string model;
  spec::FingerprintInputs inputs;
  uint64_t bytes = 0;                   // reserved against key.device_uuid's budget up front
  std::string source = "disk";          // Entry::source
  std::vector<load::SourceFile> files;  // Entry::files
  LoadFn load;
  DigestCheckFn check_digests;  // may be empty
  // The digests the load itself took of the segments it returned, taken as the digester
  // takes them (a peer fill digests each pulled segment to check it): called on the load's
  // thread after a successful load. One per segment: they become the entry's and the
  // digester does not pass over the bytes again; empty (or the function empty): it does.
  TakenDigestsFn taken_digests;
};

// Told when an entry's content enters the registry and when the registry lets it go (the
// daemon's keeper link: deposit before an entry is announced ready, drop on eviction).
// Called outside the registry's lock; may block briefly (a local socket round trip).
class EntryObserver {
 public:
  virtual ~EntryObserver() = default;
  // A load (disk, peer copy, adoption) produced `content`; runs on the load's thread
  // before the entry becomes ready: no client sees it ready before this returns.
  virtual void BeforeReady(const Entry& e, const load::LoadedModel& content) = 0;
  // The registry dropped its reference to a ready entry's content (evicted; clients that
  // still map it keep it: it may be draining).
  virtual void Evicted(const Entry& e) = 0;
};

class Registry {
 public:
  // budget_bytes: per device; 0: unlimited.
  explicit Registry(uint64_t budget_bytes = 0);
  ~Registry();
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  void SetLoadDoneCallback(LoadDoneFn fn);
  // Every load's content is digested before it becomes ready (empty: no digests).
  void SetDigester(DigestFn fn);

  // Returns the live entry for `req.key` (loading, ready) or starts `req.load` for it.
  // A failed entry is replaced by a new load. `req.bytes` reserves budget on the key's
  // device up front; when that device's budget cannot hold it even after evicting unleased
  // ready entries of the same device (LRU), the answer is RESOURCE_EXHAUSTED and nothing
  // starts. `started` tells whether this call started it.
  absl::StatusOr<std::shared_ptr<Entry>> StartOrJoin(LoadRequest req, bool* started = nullptr);

  // Waits until the entry is not loading, the deadline passes, the registry is stopped or
  // `gone` (may be empty; asked every kGoneCheck while waiting) says the waiter's caller
  // left. Returns OK when ready, the load's error when failed, DEADLINE_EXCEEDED while
  // loading, CANCELLED once Stop() was called or the caller is gone, UNAVAILABLE when
  // evicted.
  static constexpr std::chrono::milliseconds kGoneCheck{100};
  absl::Status WaitReady(const std::shared_ptr<Entry>& e,
                         std::chrono::steady_clock::time_point deadline,
                         const std::function<bool()>& gone = nullptr);
  // The entry's state, read under the lock (the entry may change right after).
  State StateOf(const std::shared_ptr<Entry>& e) const;

  // Shutdown, first step: no new load starts, every load in progress is cancelled (it ends
  // at its next chunk), and every WaitReady returns CANCELLED at once. Idempotent.
  void Stop();
  // Shutdown, after Stop(): joins every load thread (each ends at its next chunk) and
  // returns what was still loading when it was called, one "model fingerprint@device from
  // source (done of total bytes)" each, so a slow teardown can say what it waited on.
  // The owner calls it before anything a load calls into is destroyed. Idempotent.
  std::vector<std::string> JoinLoads();

  std::shared_ptr<Entry> Find(const Key& key) const;
  // Live entries with this fingerprint, on every device (ordered by device UUID).
  std::vector<std::shared_ptr<Entry>> FindAll(const std::string& fingerprint) const;
  // Live entries (loading/ready/failed) of a model.
  std::vector<std::shared_ptr<Entry>> FindByModel(const std::string& model) const;

  // A ready entry's content, for serving; FAILED_PRECONDITION when not ready.
  absl::StatusOr<std::shared_ptr<const load::LoadedModel>> Content(
      const std::shared_ptr<Entry>& e) const;

  // Leases. AddLease fails unless the entry is ready.
  absl::Status AddLease(const std::shared_ptr<Entry>& e, const LeaseRecord& lease);
  // Records the process behind a lease once its handle connection is known: the lease is
  // claimed. Until then it does not pin its entry against eviction (evicting drops it, and
  // its claim then fails): an Acquire whose token is never presented holds nothing.
  void SetLeasePeer(const std::string& lease_id, int pid, int uid);
  // Removes a lease wherever it is (a draining entry whose last lease this was is dropped);
  // false when unknown.
  bool RemoveLease(const std::string& lease_id);
  size_t LeaseCount(const Key& key) const;
  // An active lease (who acquired it, on which socket); nullopt when no such lease.
  std::optional<LeaseRecord> FindLease(const std::string& lease_id) const;
  // Whether `lease_id` is active on exactly this entry (not another entry of its key).
  bool HasLease(const std::shared_ptr<Entry>& e, const std::string& lease_id) const;

  // Evicts an entry (ready or failed): ready -> evicting -> gone, or -> draining while
  // leases remain. Returns false when there is no such live entry.
  enum class Evicted { kNone, kGone, kDraining };
  Evicted Evict(const Key& key, const std::string& reason);
  // Removes entry `e` itself when it failed (a publish that ended before its commit leaves
  // no entry behind); false when it is not failed or no longer under its key.
  bool Discard(const std::shared_ptr<Entry>& e);
  // Marks a live entry stale with what changed (status shows it); a no-op when it is gone.
  void MarkStale(const std::shared_ptr<Entry>& e, const std::string& what);

  // Integrity. Ready entries in key order.
  std::vector<std::shared_ptr<Entry>> ReadyEntries() const;
  // What a scrub pass visits: the ready entries in key order, then the draining ones that are
  // not corrupt (evicted, still mapped by leases: their holders are told of a change too).
  std::vector<std::shared_ptr<Entry>> WatchedEntries() const;
  // The content of a ready entry, or of a draining one that is not corrupt (what its lease
  // holders map), for checking only, never for serving; FAILED_PRECONDITION otherwise.
  absl::StatusOr<std::shared_ptr<const load::LoadedModel>> WatchedContent(
      const std::shared_ptr<Entry>& e) const;
  // The digests taken when `e` was filled; null when none were taken.
  std::shared_ptr<const std::vector<integrity::SegmentDigest>> Digests(
      const std::shared_ptr<Entry>& e) const;
  // The ids of the leases on `e` (claimed or not).
  std::vector<std::string> LeaseIds(const std::shared_ptr<Entry>& e) const;
  // Every segment of `e` matched its digest just now.
  void MarkVerified(const std::shared_ptr<Entry>& e);
  // `e`'s memory changed after it was sealed: it is marked corrupt with `what` and evicted
  // (reason "corrupt"): never found or served again, draining while leases map it. The
  // result of the eviction: kGone or kDraining for a ready entry; kDraining for a draining
  // entry not marked corrupt before (it stays draining, no longer watched); kNone when it was
  // marked corrupt before or is otherwise not live (it is marked all the same). `was`, when
  // not null, receives its state before.
  Evicted MarkCorrupt(const std::shared_ptr<Entry>& e, const std::string& what,
                      State* was = nullptr);

  std::vector<EntrySnapshot> Snapshot() const;
  uint64_t budget_bytes() const { return budget_; }
  uint64_t used_bytes() const;                                // all devices
  uint64_t used_bytes(const std::string& device_uuid) const;  // one device
  // Load threads not yet joined (running, or finished since the last StartOrJoin).
  size_t load_threads() const;

  using EvictFn = std::function<void(const std::string& model, const std::string& reason)>;
  void SetEvictCallback(EvictFn fn);
  // Called (outside the lock, on StartOrJoin's thread) for each load that StartOrJoin refused
  // because the device's budget cannot hold it even after evicting every unleased entry.
  using RefusedFn = std::function<void(const std::string& model, const std::string& device)>;
  void SetBudgetRefusedCallback(RefusedFn fn);
  // One observer (or null); it must outlive the registry's loads and evictions.
  void SetObserver(EntryObserver* observer);
  // Bytes on a device that the registry dropped and other processes still hold
  // (memory::Backend::LingeringBytes): counted against the budget like draining entries,
  // since eviction cannot free them. Called under the registry's lock: it must not call
  // back into the registry.
  using LingeringFn = std::function<uint64_t(const std::string& device_uuid)>;
  void SetLingeringSource(LingeringFn fn);

 private:
  // Evicts unleased ready entries of `req`'s device (LRU) until it fits the budget; when even
  // evicting all of them cannot make room, RESOURCE_EXHAUSTED (nothing evicted when that is
  // known up front).
  absl::Status MakeRoomLocked(const LoadRequest& req,
                              std::vector<std::shared_ptr<const load::LoadedModel>>* drop,
                              std::vector<std::shared_ptr<Entry>>* evicted)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Evicted EvictLocked(const Key& key, const std::string& reason,
                      std::vector<std::shared_ptr<const load::LoadedModel>>* drop,
                      std::vector<std::shared_ptr<Entry>>* evicted)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Tells the evict callback and the observer about `evicted` (outside the lock).
  void NotifyEvicted(const std::vector<std::shared_ptr<Entry>>& evicted, const std::string& reason,
                     const EvictFn& on_evict, EntryObserver* observer);
  // Whether a claimed lease maps the entry (it cannot be evicted for the budget).
  bool Pinned(const Entry& e) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Bytes reserved on `device_uuid`; all devices when null.
  uint64_t UsedLocked(const std::string* device_uuid) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RunLoad(uint64_t id, const std::shared_ptr<Entry>& e, const LoadFn& load);

  const uint64_t budget_;
  mutable Mutex mu_;
  CondVar cv_;
  std::map<Key, std::shared_ptr<Entry>> entries_ ABSL_GUARDED_BY(mu_);
  // Evicted entries that clients still map, until their last lease ends.
  std::vector<std::shared_ptr<Entry>> draining_ ABSL_GUARDED_BY(mu_);
  // Each lease's entry itself (not its key: a reload under the same key is another entry).
  std::map<std::string, std::shared_ptr<Entry>> lease_to_entry_ ABSL_GUARDED_BY(mu_);
  // Load threads not yet joined, by id; the finished ones are joined by the next
  // StartOrJoin (a long-lived daemon does not keep one thread per load it ever ran).
  std::map<uint64_t, std::thread> loads_ ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> finished_loads_ ABSL_GUARDED_BY(mu_);
  uint64_t next_load_id_ ABSL_GUARDED_BY(mu_) = 0;
  LoadDoneFn on_done_ ABSL_GUARDED_BY(mu_);
  DigestFn digester_ ABSL_GUARDED_BY(mu_);
  EvictFn on_evict_ ABSL_GUARDED_BY(mu_);
  RefusedFn on_refused_ ABSL_GUARDED_BY(mu_);
  LingeringFn lingering_ ABSL_GUARDED_BY(mu_);
  EntryObserver* observer_ ABSL_GUARDED_BY(mu_) = nullptr;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace weightcache::cache
