#include "pkg/metrics/metrics.h"

#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"
#include "prometheus/registry.h"

namespace weightcache::metrics {
namespace {

using Labels = std::map<std::string, std::string>;
// (family name, sorted labels) -> value; histograms contribute their sample count.
using Values = std::map<std::pair<std::string, Labels>, double>;

Values Snapshot(const std::vector<prometheus::MetricFamily>& families) {
  Values out;
  for (const auto& f : families) {
    for (const auto& m : f.metric) {
      Labels labels;
      for (const auto& l : m.label) labels[l.name] = l.value;
      double v = 0;
      switch (f.type) {
        case prometheus::MetricType::Counter:
          v = m.counter.value;
          break;
        case prometheus::MetricType::Gauge:
          v = m.gauge.value;
          break;
        case prometheus::MetricType::Histogram:
          v = static_cast<double>(m.histogram.sample_count);
          break;
        default:
          ADD_FAILURE() << "unexpected type in " << f.name;
      }
      out[{f.name, labels}] = v;
    }
  }
  return out;
}

Values Snapshot(const prometheus::Collectable& c) { return Snapshot(c.Collect()); }

std::optional<double> Value(const Values& values, const std::string& name, const Labels& labels) {
  auto it = values.find({name, labels});
  if (it == values.end()) return std::nullopt;
  return it->second;
}

// The series whose value differs between two snapshots (appearing counts as from 0).
std::map<std::pair<std::string, Labels>, double> Diff(const Values& before, const Values& after) {
  std::map<std::pair<std::string, Labels>, double> d;
  for (const auto& [key, v] : after) {
    auto it = before.find(key);
    const double old = it == before.end() ? 0.0 : it->second;
    if (v != old) d[key] = v - old;
  }
  for (const auto& [key, v] : before) {
    if (!after.contains(key)) d[key] = -v;
  }
  return d;
}

const prometheus::MetricFamily* FindFamily(const std::vector<prometheus::MetricFamily>& fs,
                                           const std::string& name) {
  for (const auto& f : fs) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

BuildInfo TestBuild() { return {"1.2.3", "none", "host"}; }

TEST(AcquireResultNameTest, AllNames) {
  EXPECT_STREQ(AcquireResultName(AcquireResult::kHit), "hit");
  EXPECT_STREQ(AcquireResultName(AcquireResult::kMiss), "miss");
  EXPECT_STREQ(AcquireResultName(AcquireResult::kMismatch), "mismatch");
  EXPECT_STREQ(AcquireResultName(AcquireResult::kRejected), "rejected");
  EXPECT_STREQ(AcquireResultName(AcquireResult::kError), "error");
  EXPECT_STREQ(AcquireResultName(AcquireResult::kPeerCopy), "peer_copy");
  EXPECT_STREQ(AcquireResultName(AcquireResult::kDenied), "denied");
}

TEST(MetricsTest, EachAcquireResultMovesOnlyItsOwnSeriesByOne) {
  prometheus::Registry registry;
  Metrics m(registry, TestBuild());
  m.OnAcquire("m", AcquireResult::kHit, 0.001);  // creates the model's series

  const std::string kAcquire = "weightcache_acquire_total";
  const std::string kDuration = "weightcache_acquire_duration_seconds";
  for (AcquireResult r : {AcquireResult::kHit, AcquireResult::kMiss, AcquireResult::kMismatch,
                          AcquireResult::kRejected, AcquireResult::kError, AcquireResult::kPeerCopy,
                          AcquireResult::kDenied}) {
    SCOPED_TRACE(AcquireResultName(r));
    const Values before = Snapshot(registry);
    m.OnAcquire("m", r, 0.0003);
    const auto diff = Diff(before, Snapshot(registry));
    const std::map<std::pair<std::string, Labels>, double> want = {
        {{kAcquire, {{"model", "m"}, {"result", AcquireResultName(r)}}}, 1.0},
        {{kDuration, {}}, 1.0},
    };
    EXPECT_EQ(diff, want);
  }
  const Values end = Snapshot(registry);
  EXPECT_EQ(Value(end, kAcquire, {{"model", "m"}, {"result", "hit"}}), 2.0);
  EXPECT_EQ(Value(end, kAcquire, {{"model", "m"}, {"result", "rejected"}}), 1.0);
  EXPECT_EQ(Value(end, kDuration, {}), 8.0);
}

TEST(MetricsTest, FirstSightOfAModelCreatesAllResultSeriesAtZero) {
  prometheus::Registry registry;
  Metrics m(registry, TestBuild());
  m.OnAcquire("a", AcquireResult::kMiss, 0.01);
  const Values v = Snapshot(registry);
  for (const char* r : {"hit", "mismatch", "rejected", "error", "peer_copy", "denied"}) {
    EXPECT_EQ(Value(v, "weightcache_acquire_total", {{"model", "a"}, {"result", r}}), 0.0) << r;
  }
  EXPECT_EQ(Value(v, "weightcache_acquire_total", {{"model", "a"}, {"result", "miss"}}), 1.0);
  // Another model's series are separate.
  EXPECT_EQ(Value(v, "weightcache_acquire_total", {{"model", "b"}, {"result", "miss"}}),
            std::nullopt);
}

// Alerts fire on increase() of these counters (helm/weightcache/files/alerts.yaml); a series
// born at 1 has no increase, so the first corruption of a model would never page. A known
// model's series exist at 0 before anything happens to it.
TEST(MetricsTest, AKnownModelsAlertedCountersStartAtZero) {
  prometheus::Registry registry;
  Metrics m(registry, TestBuild());
  m.OnModel("llama");
  const Values v = Snapshot(registry);
  const Labels llama = {{"model", "llama"}};
  for (const char* name :
       {"weightcache_integrity_failures_total", "weightcache_pinned_digest_mismatches_total",
        "weightcache_budget_refusals_total", "weightcache_adopted_entries_total"}) {
    EXPECT_EQ(Value(v, name, llama), 0.0) << name;
  }
  for (const char* reason :
       {"not_held", "record", "anchor", "transfer", "timeout", "digest", "memory"}) {
    EXPECT_EQ(
        Value(v, "weightcache_peer_fill_fallbacks_total", {{"model", "llama"}, {"reason", reason}}),
        0.0)
        << reason;
  }
  for (const char* anchor : {"pinned", "quorum", "single"}) {
    EXPECT_EQ(
        Value(v, "weightcache_peer_fill_anchor_total", {{"model", "llama"}, {"anchor", anchor}}),
        0.0)
        << anchor;
  }
  EXPECT_EQ(Value(v, "weightcache_acquire_total", {{"model", "llama"}, {"result", "hit"}}), 0.0);

  m.OnBudgetRefusal("llama");
  m.OnBudgetRefusal("llama");
  EXPECT_EQ(Value(Snapshot(registry), "weightcache_budget_refusals_total", llama), 2.0);

  // A name a client asked for, unknown to the daemon: its acquire series only.
  m.OnAcquire("nope", AcquireResult::kMiss, 0.001);
  const Values after = Snapshot(registry);
  EXPECT_EQ(Value(after, "weightcache_acquire_total", {{"model", "nope"}, {"result", "miss"}}),
            1.0);
  EXPECT_EQ(Value(after, "weightcache_integrity_failures_total", {{"model", "nope"}}),
            std::nullopt);
  EXPECT_EQ(Value(after, "weightcache_peer_fill_fallbacks_total",
                  {{"model", "nope"}, {"reason", "digest"}}),
            std::nullopt);
}

// weightcache_keeper_up == 0 pages (WeightcacheKeeperDown): a daemon with no keeper
// configured must not report it at all, only one whose keeper link set it.
TEST(MetricsTest, KeeperGaugesExistOnlyOnceTheKeeperLinkSetsThem) {
  prometheus::Registry registry;
  Metrics m(registry, TestBuild());
  Values v = Snapshot(registry);
  EXPECT_EQ(Value(v, "weightcache_keeper_up", {}), std::nullopt);
  EXPECT_EQ(Value(v, "weightcache_keeper_descriptors", {}), std::nullopt);
  m.SetKeeperUp(false);
  m.SetKeeperDescriptors(0);
  v = Snapshot(registry);
  EXPECT_EQ(Value(v, "weightcache_keeper_up", {}), 0.0);
  EXPECT_EQ(Value(v, "weightcache_keeper_descriptors", {}), 0.0);
  m.SetKeeperUp(true);
  m.SetKeeperDescriptors(7);
  v = Snapshot(registry);
  EXPECT_EQ(Value(v, "weightcache_keeper_up", {}), 1.0);
  EXPECT_EQ(Value(v, "weightcache_keeper_descriptors", {}), 7.0);
}

TEST(MetricsTest, AcquireHistogramBucketsFrom100usTo10s) {
  prometheus::Registry registry;
  Metrics m(registry, TestBuild());
  m.OnAcquire("m", AcquireResult::kHit, 0.00005);  // below the first bucket
  m.OnAcquire("m", AcquireResult::kHit, 0.0002);
  m.OnAcquire("m", AcquireResult::kMiss, 20.0);  // only +Inf
  const auto fs = registry.Collect();
  const auto* f = FindFamily(fs, "weightcache_acquire_duration_seconds");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(f->type, prometheus::MetricType::Histogram);
  ASSERT_EQ(f->metric.size(), 1u);
  const auto& h = f->metric[0].histogram;
  EXPECT_EQ(h.sample_count, 3u);
  EXPECT_DOUBLE_EQ(h.sample_sum, 0.00005 + 0.0002 + 20.0);
  ASSERT_EQ(h.bucket.size(), 17u);  // 16 bounds + Inf
  EXPECT_DOUBLE_EQ(h.bucket.front().upper_bound, 0.0001);
  EXPECT_EQ(h.bucket[0].cumulative_count, 1u);
  EXPECT_DOUBLE_EQ(h.bucket[1].upper_bound, 0.00025);
  EXPECT_EQ(h.bucket[1].cumulative_count, 2u);
  EXPECT_DOUBLE_EQ(h.bucket[15].upper_bound, 10.0);
  EXPECT_EQ(h.bucket[15].cumulative_count, 2u);
  EXPECT_EQ(h.bucket[16].cumulative_count, 3u);
}

TEST(MetricsTest, LoadAndEvictionCounters) {
  prometheus::Registry registry;
  Metrics m(registry, TestBuild());
  m.OnLoad("m", "disk", 42.0, 1000);
  m.OnLoad("m", "disk", 1500.0, 24);
  m.OnLoad("m", "keeper", 0.2, 7);
  m.OnEviction("m", "budget");
  const Values v = Snapshot(registry);
  EXPECT_EQ(Value(v, "weightcache_load_duration_seconds", {{"model", "m"}}), 3.0);
  EXPECT_EQ(Value(v, "weightcache_load_bytes_total", {{"model", "m"}, {"source", "disk"}}), 1024.0);
  EXPECT_EQ(Value(v, "weightcache_load_bytes_total", {{"model", "m"}, {"source", "keeper"}}), 7.0);
  EXPECT_EQ(Value(v, "weightcache_evictions_total", {{"model", "m"}, {"reason", "budget"}}), 1.0);
  EXPECT_EQ(Value(v, "weightcache_evictions_total", {{"model", "m"}, {"reason", "api"}}),
            std::nullopt);

  const auto fs = registry.Collect();
  const auto* f = FindFamily(fs, "weightcache_load_duration_seconds");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(f->metric.size(), 1u);
  EXPECT_DOUBLE_EQ(f->metric[0].histogram.bucket.rbegin()[1].upper_bound, 1800.0);  // 30 min
  EXPECT_EQ(f->metric[0].histogram.bucket.rbegin()[1].cumulative_count, 3u);
}

TEST(MetricsTest, BuildInfoIsOne) {
  prometheus::Registry registry;
  Metrics m(registry, TestBuild());
  EXPECT_EQ(Value(Snapshot(registry), "weightcache_build_info",
                  {{"version", "1.2.3"}, {"cuda", "none"}, {"backend", "host"}}),
            1.0);
}

TEST(MetricsTest, ModelLabelsAreBounded) {
  prometheus::Registry registry;
  Metrics m(registry, TestBuild());
  for (size_t i = 0; i < Metrics::kMaxModels + 10; ++i) {
    m.OnAcquire("model-" + std::to_string(i), AcquireResult::kMiss, 0.001);
  }
  m.OnAcquire("", AcquireResult::kMiss, 0.001);
  const Values v = Snapshot(registry);
  std::set<std::string> models;
  for (const auto& [key, value] : v) {
    if (key.first == "weightcache_acquire_total") models.insert(key.second.at("model"));
  }
  EXPECT_EQ(models.size(), Metrics::kMaxModels + 1);  // + the overflow series
  EXPECT_TRUE(models.contains("model-0"));
  EXPECT_FALSE(models.contains("model-" + std::to_string(Metrics::kMaxModels)));
  // 10 overflowing names + the empty one (its _unknown label no longer fits either).
  EXPECT_EQ(Value(v, "weightcache_acquire_total",
                  {{"model", Metrics::kOverflowModel}, {"result", "miss"}}),
            11.0);
  // A model seen before the cap keeps its own series.
  m.OnAcquire("model-3", AcquireResult::kHit, 0.001);
  EXPECT_EQ(Value(Snapshot(registry), "weightcache_acquire_total",
                  {{"model", "model-3"}, {"result", "hit"}}),
            1.0);
}

TEST(MetricsTest, EmptyModelNameIsRecordedAsUnknown) {
  prometheus::Registry registry;
  Metrics m(registry, TestBuild());
  m.OnAcquire("", AcquireResult::kMiss, 0.001);
  EXPECT_EQ(Value(Snapshot(registry), "weightcache_acquire_total",
                  {{"model", Metrics::kUnknownModel}, {"result", "miss"}}),
            1.0);
}

class FakeState : public StateSource {
 public:
  std::vector<EntrySnapshot> Entries() const override { return entries; }
  std::vector<DeviceSnapshot> Devices() const override { return devices; }
  StagingSnapshot Staging() const override { return staging; }
  std::vector<ListenerSnapshot> Listeners() const override { return listeners; }
  PeerPortSnapshot PeerPortState() const override { return peer_port; }
  std::vector<EntrySnapshot> entries;
  std::vector<DeviceSnapshot> devices;
  StagingSnapshot staging;
  std::vector<ListenerSnapshot> listeners;
  PeerPortSnapshot peer_port;
};

// Every listener's connections, by listener, and its refusals by reason in one family (a
// listener that refused nothing for a reason still shows the series, at 0).
TEST(MetricsTest, EveryListenersConnectionsAndRefusalsAreExportedInOneFamily) {
  prometheus::Registry registry;
  Metrics m(registry, TestBuild());
  FakeState state;
  m.SetStateSource(&state);
  auto collectable = m.collectable();
  EXPECT_EQ(Value(Snapshot(*collectable), "weightcache_connections", {{"listener", "control"}}),
            std::nullopt);
  state.listeners = {{"control", 7, 40, {{"identity", 1}, {"total", 2}, {"per_key", 3}}},
                     {"handle", 2, 5, {{"first_byte", 4}}}};
  Values v = Snapshot(*collectable);
  EXPECT_EQ(Value(v, "weightcache_connections", {{"listener", "control"}}), 7.0);
  EXPECT_EQ(Value(v, "weightcache_connections_accepted_total", {{"listener", "control"}}), 40.0);
  const char* refused = "weightcache_connections_refused_total";
  EXPECT_EQ(Value(v, refused, {{"listener", "control"}, {"reason", "identity"}}), 1.0);
  EXPECT_EQ(Value(v, refused, {{"listener", "control"}, {"reason", "total"}}), 2.0);
  EXPECT_EQ(Value(v, refused, {{"listener", "control"}, {"reason", "per_key"}}), 3.0);
  EXPECT_EQ(Value(v, refused, {{"listener", "control"}, {"reason", "descriptors"}}), 0.0);
  EXPECT_EQ(Value(v, refused, {{"listener", "handle"}, {"reason", "first_byte"}}), 4.0);
  EXPECT_EQ(Value(v, "weightcache_connections", {{"listener", "handle"}}), 2.0);

  // The metrics port's own door, from beside the state source, in the same families.
  m.SetMoreListeners([] {
    return std::vector<ListenerSnapshot>{{"metrics", 1, 9, {{"head_deadline", 5}}}};
  });
  v = Snapshot(*collectable);
  EXPECT_EQ(Value(v, "weightcache_connections", {{"listener", "metrics"}}), 1.0);
  EXPECT_EQ(Value(v, refused, {{"listener", "metrics"}, {"reason", "head_deadline"}}), 5.0);
  EXPECT_EQ(Value(v, refused, {{"listener", "metrics"}, {"reason", "per_key"}}), 0.0);
  EXPECT_EQ(Value(v, refused, {{"listener", "control"}, {"reason", "per_key"}}), 3.0);
  m.SetMoreListeners(nullptr);
  EXPECT_EQ(Value(Snapshot(*collectable), "weightcache_connections", {{"listener", "metrics"}}),
            std::nullopt);
}

// Issue 47: the peer API's port, its connections and what it closed by reason; no series
// without a peer API.
TEST(MetricsTest, ThePeerPortsRelayedConnectionsAndItsOwnRefusalsAreExported) {
  prometheus::Registry registry;
  Metrics m(registry, TestBuild());
  FakeState state;
  m.SetStateSource(&state);
  auto collectable = m.collectable();
  EXPECT_EQ(Value(Snapshot(*collectable), "weightcache_peer_connections_relayed_total", {}),
            std::nullopt);
  state.peer_port = {.present = true, .relayed = 40};
  state.listeners = {{"peer", 9, 50, {{"per_key", 2}, {"handshake_deadline", 3}, {"not_tls", 4}}}};
  Values v = Snapshot(*collectable);
  EXPECT_EQ(Value(v, "weightcache_peer_connections_relayed_total", {}), 40.0);
  const char* refused = "weightcache_connections_refused_total";
  EXPECT_EQ(Value(v, refused, {{"listener", "peer"}, {"reason", "per_key"}}), 2.0);
  EXPECT_EQ(Value(v, refused, {{"listener", "peer"}, {"reason", "handshake_deadline"}}), 3.0);
  EXPECT_EQ(Value(v, refused, {{"listener", "peer"}, {"reason", "not_tls"}}), 4.0);
  EXPECT_EQ(Value(v, refused, {{"listener", "peer"}, {"reason", "total"}}), 0.0);
}

TEST(MetricsTest, StagingMemoryIsReportedOnlyWhereThereIsAPool) {
  prometheus::Registry registry;
  Metrics m(registry, TestBuild());
  FakeState state;
  m.SetStateSource(&state);
  auto collectable = m.collectable();
  // Host backend: no pool, no series.
  EXPECT_EQ(Value(Snapshot(*collectable), "weightcache_staging_pinned_bytes", {{"state", "idle"}}),
            std::nullopt);
  state.staging = {true, 256 << 20, 64 << 20};
  Values v = Snapshot(*collectable);
  EXPECT_EQ(Value(v, "weightcache_staging_pinned_bytes", {{"state", "idle"}}), 268435456.0);
  EXPECT_EQ(Value(v, "weightcache_staging_pinned_bytes", {{"state", "in_use"}}), 67108864.0);
}

// Issue 27: corrupt entries are counted by state; checks and failures are counters. Issue 48:
// entries overdue for a check are counted, and no series tells when an entry was last checked.
TEST(MetricsTest, IntegrityIsReported) {
  prometheus::Registry registry;
  Metrics m(registry, TestBuild());
  FakeState state;
  m.SetStateSource(&state);
  auto collectable = m.collectable();
  EntrySnapshot ready{"llama", "ready", "GPU-a", 100, 1};
  ready.tp_rank = 3;
  EntrySnapshot late = ready;
  late.verify_overdue = true;
  state.entries = {
      ready, late, {"llama", "corrupt", "GPU-a", 100, 1}, {"qwen", "loading", "GPU-a", 0, 0}};
  m.OnIntegrityCheck();
  m.OnIntegrityCheck();
  m.OnIntegrityFailure("llama");
  Values v = Snapshot(*collectable);
  EXPECT_EQ(Value(v, "weightcache_models", {{"state", "corrupt"}}), 1.0);
  EXPECT_EQ(Value(v, "weightcache_integrity_overdue_entries", {}), 1.0);
  EXPECT_EQ(Value(v, "weightcache_integrity_verified_age_seconds",
                  {{"model", "llama"}, {"rank", "3"}, {"device", "GPU-a"}}),
            std::nullopt);
  EXPECT_EQ(Value(Snapshot(registry.Collect()), "weightcache_integrity_checks_total", {}), 2.0);
  EXPECT_EQ(Value(Snapshot(registry.Collect()), "weightcache_integrity_failures_total",
                  {{"model", "llama"}}),
            1.0);
}

TEST(MetricsTest, ScrapeTimeGaugesReflectTheStateSource) {
  prometheus::Registry registry;
  Metrics m(registry, TestBuild());
  FakeState state;
  m.SetStateSource(&state);
  auto collectable = m.collectable();

  // Empty source: every state reported at 0, no per-model series; no entry is overdue.
  Values v = Snapshot(*collectable);
  for (const char* s : {"loading", "ready", "stale", "draining", "evicting", "failed", "corrupt"}) {
    EXPECT_EQ(Value(v, "weightcache_models", {{"state", s}}), 0.0) << s;
  }
  EXPECT_EQ(Value(v, "weightcache_integrity_overdue_entries", {}), 0.0);
  EXPECT_EQ(v.size(), 8u);

  state.entries = {
      {"llama", "ready", "GPU-a", 100, 2},
      {"llama", "ready", "GPU-b", 50, 1},
      {"qwen", "loading", "GPU-a", 10, 0},
      {"qwen", "ready", "GPU-a", 5, 3},  // a second layout of the same model on GPU-a
      {"old", "gone", "GPU-a", 999, 0},
      {"bad", "failed", "host", 0, 0},
      // Evicted while still mapped: its memory and lease stay visible until the lease ends.
      {"llama", "draining", "GPU-a", 7, 1},
  };
  state.devices = {{"GPU-a", 1000, 400, 115}, {"host", 64, 32, 0}};
  v = Snapshot(*collectable);
  EXPECT_EQ(Value(v, "weightcache_resident_bytes", {{"model", "llama"}, {"device", "GPU-a"}}),
            107.0);
  EXPECT_EQ(Value(v, "weightcache_resident_bytes", {{"model", "llama"}, {"device", "GPU-b"}}),
            50.0);
  EXPECT_EQ(Value(v, "weightcache_resident_bytes", {{"model", "qwen"}, {"device", "GPU-a"}}), 15.0);
  EXPECT_EQ(Value(v, "weightcache_resident_bytes", {{"model", "old"}, {"device", "GPU-a"}}),
            std::nullopt);
  EXPECT_EQ(Value(v, "weightcache_leases", {{"model", "llama"}}), 4.0);
  EXPECT_EQ(Value(v, "weightcache_models", {{"state", "draining"}}), 1.0);
  EXPECT_EQ(Value(v, "weightcache_leases", {{"model", "qwen"}}), 3.0);
  EXPECT_EQ(Value(v, "weightcache_leases", {{"model", "bad"}}), 0.0);
  EXPECT_EQ(Value(v, "weightcache_models", {{"state", "ready"}}), 3.0);
  EXPECT_EQ(Value(v, "weightcache_models", {{"state", "loading"}}), 1.0);
  EXPECT_EQ(Value(v, "weightcache_models", {{"state", "evicting"}}), 0.0);
  EXPECT_EQ(Value(v, "weightcache_models", {{"state", "failed"}}), 1.0);
  EXPECT_EQ(Value(v, "weightcache_device_memory_bytes", {{"device", "GPU-a"}, {"kind", "total"}}),
            1000.0);
  EXPECT_EQ(Value(v, "weightcache_device_memory_bytes", {{"device", "GPU-a"}, {"kind", "free"}}),
            400.0);
  EXPECT_EQ(Value(v, "weightcache_device_memory_bytes", {{"device", "GPU-a"}, {"kind", "used"}}),
            115.0);
  EXPECT_EQ(Value(v, "weightcache_device_memory_bytes", {{"device", "host"}, {"kind", "total"}}),
            64.0);

  // Scrape time means scrape time: a change shows at the next collect.
  state.entries.pop_back();
  EXPECT_EQ(Value(Snapshot(*collectable), "weightcache_models", {{"state", "draining"}}), 0.0);
  state.entries.pop_back();
  EXPECT_EQ(Value(Snapshot(*collectable), "weightcache_models", {{"state", "failed"}}), 0.0);

  // The counters registry does not carry the scrape-time gauges.
  EXPECT_EQ(Value(Snapshot(registry), "weightcache_models", {{"state", "ready"}}), std::nullopt);
}

// The dashboard's "resident bytes against the budget" and "load progress" panels.
TEST(MetricsTest, BudgetAndLoadProgressAreReportedPerDevice) {
  // Destroyed in reverse: the Metrics (which detaches the source) before the state.
  struct {
    prometheus::Registry registry;
    FakeState state;
    Metrics m{registry, TestBuild()};
  } t;
  t.m.SetStateSource(&t.state);
  FakeState& state = t.state;
  const auto collectable = t.m.collectable();
  EntrySnapshot loading{"llama", "loading", "GPU-a", 0, 0};
  loading.load_done_bytes = 30;
  loading.load_total_bytes = 120;
  EntrySnapshot ready{"llama", "ready", "GPU-a", 80, 1};
  ready.load_done_bytes = ready.load_total_bytes = 80;  // a second layout, loaded
  state.entries = {loading, ready, {"old", "gone", "GPU-a", 5, 0}};
  state.devices = {{"GPU-a", 1000, 400, 80, 500}, {"GPU-b", 1000, 1000, 0, 500}};
  Values v = Snapshot(*collectable);
  EXPECT_EQ(Value(v, "weightcache_load_progress_bytes",
                  {{"model", "llama"}, {"device", "GPU-a"}, {"kind", "done"}}),
            110.0);
  EXPECT_EQ(Value(v, "weightcache_load_progress_bytes",
                  {{"model", "llama"}, {"device", "GPU-a"}, {"kind", "total"}}),
            200.0);
  EXPECT_EQ(Value(v, "weightcache_load_progress_bytes",
                  {{"model", "old"}, {"device", "GPU-a"}, {"kind", "total"}}),
            std::nullopt);
  EXPECT_EQ(Value(v, "weightcache_memory_budget_bytes", {{"device", "GPU-a"}}), 500.0);
  EXPECT_EQ(Value(v, "weightcache_memory_budget_bytes", {{"device", "GPU-b"}}), 500.0);
  // Unlimited (0): no budget series.
  state.devices = {{"GPU-a", 1000, 400, 80, 0}};
  EXPECT_EQ(Value(Snapshot(*collectable), "weightcache_memory_budget_bytes", {{"device", "GPU-a"}}),
            std::nullopt);
}

TEST(MetricsTest, CollectableOutlivingMetricsReportsNothing) {
  prometheus::Registry registry;
  FakeState state;
  state.entries = {{"llama", "ready", "GPU-a", 100, 2}};
  std::shared_ptr<prometheus::Collectable> collectable;
  {
    Metrics m(registry, TestBuild());
    m.SetStateSource(&state);
    collectable = m.collectable();
    EXPECT_FALSE(collectable->Collect().empty());
  }
  EXPECT_TRUE(collectable->Collect().empty());
}

TEST(MetricsTest, ConcurrentUpdatesAreAllCounted) {
  prometheus::Registry registry;
  Metrics m(registry, TestBuild());
  constexpr int kThreads = 4;
  constexpr int kPerThread = 2000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&m, t] {
      for (int i = 0; i < kPerThread; ++i) {
        m.OnAcquire(t % 2 == 0 ? "even" : "odd", AcquireResult::kHit, 0.001);
      }
    });
  }
  for (auto& th : threads) th.join();
  const Values v = Snapshot(registry);
  EXPECT_EQ(Value(v, "weightcache_acquire_total", {{"model", "even"}, {"result", "hit"}}),
            2.0 * kPerThread);
  EXPECT_EQ(Value(v, "weightcache_acquire_total", {{"model", "odd"}, {"result", "hit"}}),
            2.0 * kPerThread);
  EXPECT_EQ(Value(v, "weightcache_acquire_duration_seconds", {}), 1.0 * kThreads * kPerThread);
}

TEST(MetricsTest, NoStateSourceNoGauges) {
  prometheus::Registry registry;
  Metrics m(registry, TestBuild());
  EXPECT_TRUE(m.collectable()->Collect().empty());
}

}  // namespace
}  // namespace weightcache::metrics
