#include "pkg/metrics/metrics.h"

#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "pkg/metrics/internal/state_collector.h"
#include "pkg/util/log.h"
#include "prometheus/collectable.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/metric_family.h"
#include "prometheus/registry.h"

namespace weightcache::metrics {

namespace {

constexpr AcquireResult kAllResults[] = {AcquireResult::kHit,      AcquireResult::kMiss,
                                         AcquireResult::kMismatch, AcquireResult::kRejected,
                                         AcquireResult::kError,    AcquireResult::kPeerCopy,
                                         AcquireResult::kStale,    AcquireResult::kDenied};

// Peer fill's fallback reasons (FillFallbackName, pkg/server/peer/peer_fill.cc) and anchors
// (pkg/server/peer/fill_anchor.h): each model's series are created at 0 with it, so that an
// alert on increase() sees the first fallback (a series born at 1 has no increase).
constexpr const char* kFallbackReasons[] = {"not_held", "record", "anchor", "transfer",
                                            "timeout",  "digest", "memory"};
constexpr const char* kAnchors[] = {"pinned", "quorum", "single"};

// An acquire is a map of FDs on a hit (sub-millisecond) and can be a full load on a miss
// that the policy turns into a load: 100 µs .. 10 s.
prometheus::Histogram::BucketBoundaries AcquireBuckets() {
  return {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
          0.05,   0.1,     0.25,   0.5,   1,      2.5,   5,    10};
}

// A load reads up to ~120 GB per GPU from disk: 100 ms .. 30 min.
prometheus::Histogram::BucketBoundaries LoadBuckets() {
  return {0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1200, 1800};
}

}  // namespace

const char* AcquireResultName(AcquireResult r) {
  switch (r) {
    case AcquireResult::kHit:
      return "hit";
    case AcquireResult::kMiss:
      return "miss";
    case AcquireResult::kMismatch:
      return "mismatch";
    case AcquireResult::kRejected:
      return "rejected";
    case AcquireResult::kError:
      return "error";
    case AcquireResult::kPeerCopy:
      return "peer_copy";
    case AcquireResult::kStale:
      return "stale";
    case AcquireResult::kDenied:
      return "denied";
  }
  ::weightcache::CheckFailed(__FILE__, __LINE__, "unknown AcquireResult");
}

struct Metrics::Impl {
  Impl(prometheus::Registry& registry, const BuildInfo& build)
      : acquire_total(prometheus::BuildCounter()
                          .Name("weightcache_acquire_total")
                          .Help("Acquire requests by model and result (hit, miss, mismatch, "
                                "rejected, error, peer_copy, stale).")
                          .Register(registry)),
        acquire_duration(prometheus::BuildHistogram()
                             .Name("weightcache_acquire_duration_seconds")
                             .Help("Time to answer an Acquire request, in seconds.")
                             .Register(registry)
                             .Add({}, AcquireBuckets())),
        load_duration(prometheus::BuildHistogram()
                          .Name("weightcache_load_duration_seconds")
                          .Help("Time to load a model into the cache, in seconds.")
                          .Register(registry)),
        load_bytes(prometheus::BuildCounter()
                       .Name("weightcache_load_bytes_total")
                       .Help("Bytes loaded into the cache by model and source (disk, keeper, "
                             "peer).")
                       .Register(registry)),
        evictions(prometheus::BuildCounter()
                      .Name("weightcache_evictions_total")
                      .Help("Cache entries evicted by model and reason (api, budget).")
                      .Register(registry)),
        refusals(prometheus::BuildCounter()
                     .Name("weightcache_refusals_total")
                     .Help("Control-plane requests refused, by rule (admin, lease_owner, "
                           "model_roots, allowlist, connection_cap, publish, namespace, placement; "
                           "http2_streams, http2_header_block, http2_resets: a control connection "
                           "closed for an HTTP/2 limit).")
                     .Register(registry)),
        pinned_mismatches(prometheus::BuildCounter()
                              .Name("weightcache_pinned_digest_mismatches_total")
                              .Help("Loads and opens refused because a checkpoint file hashes "
                                    "otherwise than the spec's pinned digest, by model.")
                              .Register(registry)),
        keeper_up(prometheus::BuildGauge()
                      .Name("weightcache_keeper_up")
                      .Help("1 while the daemon is connected to its keeper, else 0; absent "
                            "when no keeper is configured.")
                      .Register(registry)),
        keeper_fds(prometheus::BuildGauge()
                       .Name("weightcache_keeper_descriptors")
                       .Help("Segment descriptors deposited with the keeper (held for the "
                             "entries that are ready); absent when no keeper is configured.")
                       .Register(registry)),
        budget_refusals(prometheus::BuildCounter()
                            .Name("weightcache_budget_refusals_total")
                            .Help("Loads refused because the device's memory budget cannot hold "
                                  "them even after evicting every unleased entry, by model.")
                            .Register(registry)),
        adopted(prometheus::BuildCounter()
                    .Name("weightcache_adopted_entries_total")
                    .Help("Cache entries re-adopted from the keeper at start (served without "
                          "reading the disk), by model.")
                    .Register(registry)),
        keeper_impostors(prometheus::BuildCounter()
                             .Name("weightcache_keeper_impostors_total")
                             .Help("Connections to --keeper_socket refused because the process "
                                   "serving it runs as another uid than the keeper's, by the "
                                   "uid found and the uid expected.")
                             .Register(registry)),
        peer_fill_bytes(prometheus::BuildCounter()
                            .Name("weightcache_peer_fill_bytes_total")
                            .Help("Bytes filled from other nodes' daemons (peer fill), by model.")
                            .Register(registry)),
        peer_fill_seconds(prometheus::BuildHistogram()
                              .Name("weightcache_peer_fill_seconds")
                              .Help("Time to fill a model-rank from other nodes' daemons, in "
                                    "seconds.")
                              .Register(registry)),
        peer_fill_fallbacks(prometheus::BuildCounter()
                                .Name("weightcache_peer_fill_fallbacks_total")
                                .Help("Loads that asked the peers and read from disk instead, by "
                                      "model and reason (not_held, record, anchor, transfer, "
                                      "timeout, digest, memory).")
                                .Register(registry)),
        peer_fill_anchors(prometheus::BuildCounter()
                              .Name("weightcache_peer_fill_anchor_total")
                              .Help("Fills from other nodes' daemons whose segments were served, "
                                    "by model and what vouched for the holders' records (anchor: "
                                    "pinned, quorum, single).")
                              .Register(registry)),
        integrity_checks(prometheus::BuildCounter()
                             .Name("weightcache_integrity_checks_total")
                             .Help("Resident entries whose every segment was digested again and "
                                   "compared (scrub passes and verify --resident).")
                             .Register(registry)
                             .Add({})),
        integrity_failures(prometheus::BuildCounter()
                               .Name("weightcache_integrity_failures_total")
                               .Help("Resident entries found changed after sealing (marked "
                                     "corrupt), by model.")
                               .Register(registry)),
        publishes(prometheus::BuildCounter()
                      .Name("weightcache_publish_total")
                      .Help("Publishes by model and result (published, joined, aborted, "
                            "mismatch, error).")
                      .Register(registry)),
        artifact_requests(prometheus::BuildCounter()
                              .Name("weightcache_artifact_requests_total")
                              .Help("Compile artifact gets (hit, miss, refused, error) and puts "
                                    "(stored, exists, busy, refused, error), by model.")
                              .Register(registry)),
        artifact_bytes(prometheus::BuildCounter()
                           .Name("weightcache_artifact_bytes_total")
                           .Help("Compile artifact bytes served by gets (op=get, zero-copy) and "
                                 "stored by puts (op=put), by model.")
                           .Register(registry)),
        artifact_resident(prometheus::BuildGauge()
                              .Name("weightcache_artifact_resident_bytes")
                              .Help("Host memory held by compile artifacts (under "
                                    "--artifact_budget).")
                              .Register(registry)
                              .Add({})) {
    for (const char* rule :
         {"admin", "lease_owner", "model_roots", "allowlist", "connection_cap", "publish"}) {
      refusals.Add({{"rule", rule}});
    }
    prometheus::BuildGauge()
        .Name("weightcache_build_info")
        .Help("Always 1; labels describe the running build.")
        .Register(registry)
        .Add({{"version", build.version}, {"cuda", build.cuda}, {"backend", build.backend}})
        .Set(1);
  }

  // The label value to record for `model`; on the first sight of a model, creates its
  // acquire series at 0 so that ratios over them are defined from the start.
  std::string ModelLabel(const std::string& model) ABSL_LOCKS_EXCLUDED(mu) {
    std::string label = model.empty() ? Metrics::kUnknownModel : model;
    absl::MutexLock lock(&mu);
    if (models.contains(label)) return label;
    if (models.size() >= Metrics::kMaxModels) {
      if (!overflow_logged) {
        WC_LOG_WARN("metrics: more than %d model names; counting new ones as model=\"%s\"",
                    static_cast<int>(Metrics::kMaxModels), Metrics::kOverflowModel);
        overflow_logged = true;
      }
      label = Metrics::kOverflowModel;
      if (models.contains(label)) return label;
    }
    models.insert(label);
    for (AcquireResult r : kAllResults) {
      acquire_total.Add({{"model", label}, {"result", AcquireResultName(r)}});
    }
    return label;
  }

  // Families are owned by the registry; the references stay valid while it lives. Family
  // and metric objects are thread-safe on their own.
  prometheus::Family<prometheus::Counter>& acquire_total;
  prometheus::Histogram& acquire_duration;
  prometheus::Family<prometheus::Histogram>& load_duration;
  prometheus::Family<prometheus::Counter>& load_bytes;
  prometheus::Family<prometheus::Counter>& evictions;
  prometheus::Family<prometheus::Counter>& refusals;
  prometheus::Family<prometheus::Counter>& pinned_mismatches;
  // Created by the first Set (the keeper link's): absent without a keeper, so that an alert
  // on weightcache_keeper_up == 0 fires only where a keeper is meant to be.
  prometheus::Family<prometheus::Gauge>& keeper_up;
  prometheus::Family<prometheus::Gauge>& keeper_fds;
  prometheus::Family<prometheus::Counter>& budget_refusals;
  prometheus::Family<prometheus::Counter>& adopted;
  prometheus::Family<prometheus::Counter>& keeper_impostors;
  prometheus::Family<prometheus::Counter>& peer_fill_bytes;
  prometheus::Family<prometheus::Histogram>& peer_fill_seconds;
  prometheus::Family<prometheus::Counter>& peer_fill_fallbacks;
  prometheus::Family<prometheus::Counter>& peer_fill_anchors;
  prometheus::Counter& integrity_checks;
  prometheus::Family<prometheus::Counter>& integrity_failures;
  prometheus::Family<prometheus::Counter>& publishes;
  prometheus::Family<prometheus::Counter>& artifact_requests;
  prometheus::Family<prometheus::Counter>& artifact_bytes;
  prometheus::Gauge& artifact_resident;
  const std::shared_ptr<internal::StateCollector> collector =
      std::make_shared<internal::StateCollector>();

  absl::Mutex mu;
  absl::flat_hash_set<std::string> models ABSL_GUARDED_BY(mu);
  bool overflow_logged ABSL_GUARDED_BY(mu) = false;
};

Metrics::Metrics(prometheus::Registry& registry, const BuildInfo& build)
    : impl_(std::make_unique<Impl>(registry, build)) {}

Metrics::~Metrics() {
  // Waits for a scrape in progress; afterwards the collectable no longer reads the source.
  impl_->collector->SetSource(nullptr);
}

void Metrics::SetStateSource(const StateSource* source) { impl_->collector->SetSource(source); }

void Metrics::SetMoreListeners(std::function<std::vector<ListenerSnapshot>()> more) {
  impl_->collector->SetMoreListeners(std::move(more));
}

std::shared_ptr<prometheus::Collectable> Metrics::collectable() const { return impl_->collector; }

void Metrics::OnAcquire(const std::string& model, AcquireResult result, double seconds) {
  const std::string label = impl_->ModelLabel(model);
  impl_->acquire_total.Add({{"model", label}, {"result", AcquireResultName(result)}}).Increment();
  impl_->acquire_duration.Observe(seconds);
}

void Metrics::OnLoad(const std::string& model, const std::string& source, double seconds,
                     uint64_t bytes) {
  const std::string label = impl_->ModelLabel(model);
  impl_->load_duration.Add({{"model", label}}, LoadBuckets()).Observe(seconds);
  impl_->load_bytes.Add({{"model", label}, {"source", source}})
      .Increment(static_cast<double>(bytes));
}

void Metrics::OnEviction(const std::string& model, const std::string& reason) {
  const std::string label = impl_->ModelLabel(model);
  impl_->evictions.Add({{"model", label}, {"reason", reason}}).Increment();
}

void Metrics::OnPublish(const std::string& model, const std::string& result) {
  const std::string label = impl_->ModelLabel(model);
  impl_->publishes.Add({{"model", label}, {"result", result}}).Increment();
}

void Metrics::OnRefused(const std::string& rule) {
  impl_->refusals.Add({{"rule", rule}}).Increment();
}

void Metrics::OnPinnedDigestMismatch(const std::string& model) {
  impl_->pinned_mismatches.Add({{"model", impl_->ModelLabel(model)}}).Increment();
}

void Metrics::OnIntegrityCheck() { impl_->integrity_checks.Increment(); }

void Metrics::OnIntegrityFailure(const std::string& model) {
  impl_->integrity_failures.Add({{"model", impl_->ModelLabel(model)}}).Increment();
}

void Metrics::OnArtifact(const std::string& model, const std::string& op, const std::string& result,
                         uint64_t bytes) {
  const std::string label = impl_->ModelLabel(model);
  impl_->artifact_requests.Add({{"model", label}, {"op", op}, {"result", result}}).Increment();
  if (bytes > 0) {
    impl_->artifact_bytes.Add({{"model", label}, {"op", op}}).Increment(static_cast<double>(bytes));
  }
}

void Metrics::SetArtifactResidentBytes(uint64_t bytes) {
  impl_->artifact_resident.Set(static_cast<double>(bytes));
}

void Metrics::SetKeeperUp(bool up) { impl_->keeper_up.Add({}).Set(up ? 1 : 0); }

void Metrics::SetKeeperDescriptors(uint64_t n) {
  impl_->keeper_fds.Add({}).Set(static_cast<double>(n));
}

// Only for the models the daemon knows: an Acquire of any name creates that name's acquire
// series only, so that clients asking for names do not grow every family.
void Metrics::OnModel(const std::string& model) {
  const std::string label = impl_->ModelLabel(model);
  // The counters that alerts watch for any increase (docs/metrics.md, "Alerts").
  impl_->integrity_failures.Add({{"model", label}});
  impl_->pinned_mismatches.Add({{"model", label}});
  impl_->budget_refusals.Add({{"model", label}});
  impl_->adopted.Add({{"model", label}});
  for (const char* reason : kFallbackReasons) {
    impl_->peer_fill_fallbacks.Add({{"model", label}, {"reason", reason}});
  }
  for (const char* anchor : kAnchors) {
    impl_->peer_fill_anchors.Add({{"model", label}, {"anchor", anchor}});
  }
}

void Metrics::OnBudgetRefusal(const std::string& model) {
  impl_->budget_refusals.Add({{"model", impl_->ModelLabel(model)}}).Increment();
}

void Metrics::OnKeeperImpostor(uint32_t found_uid, uint32_t expected_uid) {
  impl_->keeper_impostors
      .Add({{"found_uid", std::to_string(found_uid)},
            {"expected_uid", std::to_string(expected_uid)}})
      .Increment();
}

void Metrics::OnAdopted(const std::string& model) {
  impl_->adopted.Add({{"model", impl_->ModelLabel(model)}}).Increment();
}

void Metrics::OnPeerFill(const std::string& model, double seconds, uint64_t bytes) {
  OnPeerFillBytes(model, bytes);
  impl_->peer_fill_seconds.Add({{"model", impl_->ModelLabel(model)}}, LoadBuckets())
      .Observe(seconds);
}

void Metrics::OnPeerFillBytes(const std::string& model, uint64_t bytes) {
  impl_->peer_fill_bytes.Add({{"model", impl_->ModelLabel(model)}})
      .Increment(static_cast<double>(bytes));
}

void Metrics::OnPeerFillAnchor(const std::string& model, const std::string& anchor) {
  impl_->peer_fill_anchors.Add({{"model", impl_->ModelLabel(model)}, {"anchor", anchor}})
      .Increment();
}

void Metrics::OnPeerFillFallback(const std::string& model, const std::string& reason) {
  impl_->peer_fill_fallbacks.Add({{"model", impl_->ModelLabel(model)}, {"reason", reason}})
      .Increment();
}

}  // namespace weightcache::metrics
