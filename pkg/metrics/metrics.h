// weightcache's Prometheus metrics. One Metrics object is created in main around a
// prometheus::Registry that main owns, and injected (as a pointer that may be null in
// tests) into the components that update it. No global registry.
//
// Names follow Prometheus conventions: prefix weightcache_, base units, _total counters.
// Labels are bounded: model names come from specs, devices are GPU UUIDs or "host";
// never client PIDs or lease ids. docs/metrics.md lists every metric.
//
// Thread-safety: every method may be called from any thread. The gauges that describe
// current state (resident bytes, leases, models by state, device memory) are computed at
// scrape time from the StateSource given to Metrics, which must outlive it.
//
// Lifetimes: the prometheus::Registry must outlive Metrics (the counters live in it). The
// scrape-time collectable (collectable()) may outlive Metrics: ~Metrics detaches the
// StateSource and waits for a scrape in progress, so after it returns the source is never
// called again and the collectable reports nothing.
//
// Typical wiring in main (see pkg/metrics/http_server.h):
//   auto registry = std::make_shared<prometheus::Registry>();
//   metrics::Metrics m(*registry, {kVersion, kCudaVersion, backend_name});
//   m.SetStateSource(&server_state);
//   WC_ASSIGN_OR_RETURN(auto http, metrics::HttpServer::Start(address_flag));
//   http->RegisterCollectable(registry);
//   http->RegisterCollectable(m.collectable());
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace prometheus {
class Collectable;
class Registry;
}  // namespace prometheus

namespace weightcache::metrics {

// kStale: the asked model's files changed on disk after its entry was loaded.
// kDenied: the model's allowed_namespaces do not admit the calling pod, or the pod could not
// be identified (--namespace_rules; fail closed).
enum class AcquireResult { kHit, kMiss, kMismatch, kRejected, kError, kPeerCopy, kStale, kDenied };
const char* AcquireResultName(AcquireResult r);  // "hit", "miss", ...

struct EntrySnapshot {
  std::string model;
  std::string state;   // loading | ready | stale | draining | evicting | gone | failed
  std::string device;  // GPU UUID or "host"
  uint64_t bytes = 0;
  uint64_t leases = 0;
  int tp_rank = 0;
  uint64_t load_done_bytes = 0;   // the loader's progress: bytes loaded so far
  uint64_t load_total_bytes = 0;  // and bytes to load (equal once loaded)
  // A ready entry whose segments have not all matched their digests (integrity scrubbing)
  // for two scrub intervals and a minute. Not the age itself: that would tell whoever
  // scrapes when the last pass ended (issue 48).
  bool verify_overdue = false;
};
struct DeviceSnapshot {
  std::string device;  // GPU UUID or "host"
  uint64_t total_bytes = 0;
  uint64_t free_bytes = 0;
  uint64_t cache_bytes = 0;   // used by the cache
  uint64_t budget_bytes = 0;  // what the cache may use on it (--memory_budget); 0: unlimited
};

// Page-locked host memory the GPU loader keeps for staging (pkg/load/staging_pool.h).
struct StagingSnapshot {
  bool present = false;  // false: no staging pool (host backend): no series
  uint64_t idle_bytes = 0;
  uint64_t in_use_bytes = 0;  // leased by loads in progress
};

// One listener behind the acceptor (pkg/net/acceptor.h): "control", "handle", "peer", … —
// its connections held now, handed over since start, and refused at the door by reason
// ("identity", "total", "per_key", "first_byte", "descriptors").
struct ListenerSnapshot {
  std::string listener;
  uint64_t open = 0;
  uint64_t accepted = 0;
  std::map<std::string, uint64_t> refused;
};

// The peer API's TCP port (pkg/server/wire/peer_port.h): the connections it handed to its gRPC
// server since start (once their client spoke). Its connections and refusals are a listener's
// (ListenerSnapshot "peer").
struct PeerPortSnapshot {
  bool present = false;  // false: no peer API: no series
  uint64_t relayed = 0;
};

// What the scrape-time gauges read. Implemented by the registry owner (the server).
class StateSource {
 public:
  virtual ~StateSource() = default;
  virtual std::vector<EntrySnapshot> Entries() const = 0;
  virtual std::vector<DeviceSnapshot> Devices() const = 0;
  virtual StagingSnapshot Staging() const { return {}; }
  virtual std::vector<ListenerSnapshot> Listeners() const { return {}; }
  virtual PeerPortSnapshot PeerPortState() const { return {}; }
};

struct BuildInfo {
  std::string version;
  std::string cuda;     // CUDA runtime version built against, or "none"
  std::string backend;  // active backend
};

class Metrics {
 public:
  Metrics(prometheus::Registry& registry, const BuildInfo& build);
  ~Metrics();
  Metrics(const Metrics&) = delete;
  Metrics& operator=(const Metrics&) = delete;

  // Attach the scrape-time source (call once, before serving). May stay unset in tests;
  // while unset, the scrape-time gauges are absent. Passing nullptr detaches. The source's
  // methods are called from the scraping thread under an internal lock that this call and
  // ~Metrics also take (so they wait for a scrape in progress): do not call them, or destroy
  // Metrics, while holding a lock that Entries()/Devices() take.
  void SetStateSource(const StateSource* source);
  // Listeners the state source does not know (the metrics port's own, HttpServer::listener),
  // exported beside its Listeners(); called under the same lock. Empty detaches.
  void SetMoreListeners(std::function<std::vector<ListenerSnapshot>()> more);

  // The scrape-time gauges (resident bytes, leases, models by state, device memory) as a
  // prometheus::Collectable, to register with the HTTP exposer next to the registry.
  std::shared_ptr<prometheus::Collectable> collectable() const;

  // At most this many distinct model label values are recorded by the On* counters; later
  // new names are counted under kOverflowModel, so a client asking for arbitrary names
  // cannot grow the series without bound. An empty model name is recorded as kUnknownModel.
  static constexpr size_t kMaxModels = 256;
  static constexpr const char* kOverflowModel = "_other";
  static constexpr const char* kUnknownModel = "_unknown";

  // A model the daemon knows (from a spec, or defined later): creates its per-model counter
  // series at 0, so that the first increase of any of them is seen by increase()/rate() (an
  // alert on corruption must fire on the first one). The On* calls below create only the
  // acquire series of a name they see first (clients may ask for any name).
  void OnModel(const std::string& model);
  void OnAcquire(const std::string& model, AcquireResult result, double seconds);
  void OnLoad(const std::string& model, const std::string& source /* disk|keeper|peer */,
              double seconds, uint64_t bytes);
  void OnEviction(const std::string& model, const std::string& reason /* api|budget */);
  // A load refused because its device's memory budget cannot hold it even after evicting
  // every unleased entry (the cache is full of loading, leased or draining entries).
  void OnBudgetRefusal(const std::string& model);
  // A publish that ended: `result` published | joined (another publisher had the key) |
  // aborted (abort, or the publisher's connection closed before its commit) | mismatch (a
  // commit that differs from its begin) | error (bounded set).
  void OnPublish(const std::string& model, const std::string& result);
  // A control-plane request refused by an authorization rule or a connection cap.
  // `rule`: admin | lease_owner | model_roots | allowlist | connection_cap | publish.
  void OnRefused(const std::string& rule);
  // A load or open of `model` refused because a checkpoint file hashes otherwise than the
  // spec's pinned digest (load::IsPinnedDigestMismatch).
  void OnPinnedDigestMismatch(const std::string& model);
  // Integrity: a resident entry's digests were checked (scrub pass or verify), and when a
  // check found changed memory (the entry became corrupt).
  void OnIntegrityCheck();
  void OnIntegrityFailure(const std::string& model);
  // The keeper link: whether a keeper is connected (weightcache_keeper_up), the descriptors
  // deposited with it (weightcache_keeper_descriptors), and each entry re-adopted from it at
  // start (weightcache_adopted_entries_total).
  void SetKeeperUp(bool up);
  void SetKeeperDescriptors(uint64_t n);
  // A connection to the keeper socket refused: the process serving it runs as `found_uid`,
  // not the keeper's `expected_uid` (weightcache_keeper_impostors_total).
  void OnKeeperImpostor(uint32_t found_uid, uint32_t expected_uid);
  void OnAdopted(const std::string& model);
  // Peer fill (issue 30): a model-rank filled from other nodes' daemons (its bytes and
  // seconds), and a load that asked the peers and read from disk instead, by reason
  // (not_held | record | anchor | transfer | timeout | digest | memory: peer_fill.h).
  void OnPeerFill(const std::string& model, double seconds, uint64_t bytes);
  // The bytes of a fill that failed part way and kept what it filled (the rest read from
  // disk): counted in weightcache_peer_fill_bytes_total, not as a fill's seconds.
  void OnPeerFillBytes(const std::string& model, uint64_t bytes);
  void OnPeerFillFallback(const std::string& model, const std::string& reason);
  // What vouched for the records of a fill whose segments were served (issue 48): anchor
  // pinned | quorum | single (pkg/server/peer/fill_anchor.h).
  void OnPeerFillAnchor(const std::string& model, const std::string& anchor);
  // Compile artifacts (issue 29): each get or put that ended, by model, op (get | put) and
  // result (get: hit | miss | refused | error; put: stored | exists | busy | refused |
  // error), the bytes a hit served or a put stored, and what the store holds in memory.
  void OnArtifact(const std::string& model, const std::string& op, const std::string& result,
                  uint64_t bytes);
  void SetArtifactResidentBytes(uint64_t bytes);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace weightcache::metrics
