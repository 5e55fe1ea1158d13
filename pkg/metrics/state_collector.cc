#include "pkg/metrics/internal/state_collector.h"

#include <map>
#include <string>
#include <utility>

#include "pkg/util/log.h"

namespace weightcache::metrics::internal {
namespace {

// The states weightcache_models reports, always all of them (0 when none). "gone" entries
// are on their way out of the registry and are not reported. "stale": ready, but its files
// changed on disk; "draining": evicted while clients still map it (until the last lease ends).
// "corrupt": its memory changed after sealing; out of service, until its last lease ends.
constexpr const char* kReportedStates[] = {"loading",  "ready",  "stale",  "draining",
                                           "evicting", "failed", "corrupt"};

prometheus::ClientMetric GaugeMetric(std::vector<prometheus::ClientMetric::Label> labels,
                                     double value) {
  prometheus::ClientMetric m;
  m.label = std::move(labels);
  m.gauge.value = value;
  return m;
}

prometheus::ClientMetric CounterMetric(std::vector<prometheus::ClientMetric::Label> labels,
                                       double value) {
  prometheus::ClientMetric m;
  m.label = std::move(labels);
  m.counter.value = value;
  return m;
}

void AddListeners(const std::vector<ListenerSnapshot>& listeners,
                  std::vector<prometheus::MetricFamily>* out) {
  // Filled here and moved in at the end: a pointer into `out` would not outlive its growth.
  prometheus::MetricFamily open_f{"weightcache_connections",
                                  "Connections open now, by listener.",
                                  prometheus::MetricType::Gauge,
                                  {}};
  prometheus::MetricFamily accepted_f{
      "weightcache_connections_accepted_total",
      "Connections accepted and handed to their listener since start.",
      prometheus::MetricType::Counter,
      {}};
  prometheus::MetricFamily refused_f{
      "weightcache_connections_refused_total",
      "Connections refused at the door (the acceptor), by listener and reason: identity (the "
      "peer is not allowed, e.g. not in --allowed_uids), total (the listener's cap in all), "
      "per_key (the caller's cap: pod, source address or uid), first_byte (sent nothing in "
      "time), descriptors (out of descriptors: backed off); the peer port's own: "
      "handshake_deadline, not_tls, handover; the metrics port's own: head_deadline (the request "
      "head did not arrive in time), bad_request (too large or not HTTP).",
      prometheus::MetricType::Counter,
      {}};
  auto* open = &open_f.metric;
  auto* accepted = &accepted_f.metric;
  auto* refused = &refused_f.metric;
  for (const ListenerSnapshot& l : listeners) {
    open->push_back(GaugeMetric({{"listener", l.listener}}, static_cast<double>(l.open)));
    accepted->push_back(CounterMetric({{"listener", l.listener}}, static_cast<double>(l.accepted)));
    // The door's reasons always (at 0 until they happen), then the listener's own.
    std::map<std::string, uint64_t> by_reason = l.refused;
    for (const char* reason : {"identity", "total", "per_key", "first_byte", "descriptors"}) {
      by_reason.emplace(reason, 0);
    }
    for (const auto& [reason, n] : by_reason) {
      refused->push_back(
          CounterMetric({{"listener", l.listener}, {"reason", reason}}, static_cast<double>(n)));
    }
  }
  out->push_back(std::move(open_f));
  out->push_back(std::move(accepted_f));
  out->push_back(std::move(refused_f));
}

void AddPeerPort(const PeerPortSnapshot& p, std::vector<prometheus::MetricFamily>* out) {
  out->push_back(prometheus::MetricFamily{
      "weightcache_peer_connections_relayed_total",
      "Connections the peer API's port handed to its gRPC server (once their client spoke) "
      "since start.",
      prometheus::MetricType::Counter,
      {CounterMetric({}, static_cast<double>(p.relayed))}});
}

}  // namespace

std::vector<prometheus::MetricFamily> StateCollector::Collect() const {
  absl::MutexLock lock(&mu_);
  if (source_ == nullptr) return {};
  const std::vector<EntrySnapshot> entries = source_->Entries();
  const std::vector<DeviceSnapshot> devices = source_->Devices();
  const StagingSnapshot staging = source_->Staging();
  std::vector<ListenerSnapshot> listeners = source_->Listeners();
  if (more_listeners_) {
    for (ListenerSnapshot& l : more_listeners_()) listeners.push_back(std::move(l));
  }
  const PeerPortSnapshot peer_port = source_->PeerPortState();

  std::map<std::pair<std::string, std::string>, uint64_t> resident;  // (model, device)
  // (model, device) -> bytes loaded so far and bytes to load
  std::map<std::pair<std::string, std::string>, std::pair<uint64_t, uint64_t>> progress;
  std::map<std::string, uint64_t> leases;  // model
  std::map<std::string, uint64_t> states;
  for (const char* s : kReportedStates) states[s] = 0;
  for (const EntrySnapshot& e : entries) {
    if (e.state == "gone") continue;
    resident[{e.model, e.device}] += e.bytes;
    auto& p = progress[{e.model, e.device}];
    p.first += e.load_done_bytes;
    p.second += e.load_total_bytes;
    leases[e.model] += e.leases;
    auto it = states.find(e.state);
    if (it != states.end()) {
      ++it->second;
    } else {
      WC_LOG_DEBUG("metrics: entry %s in unknown state '%s' not counted", e.model, e.state);
    }
  }

  std::vector<prometheus::MetricFamily> out;
  {
    prometheus::MetricFamily f{"weightcache_resident_bytes",
                               "Bytes of cached weights held per model and device.",
                               prometheus::MetricType::Gauge,
                               {}};
    for (const auto& [key, bytes] : resident) {
      f.metric.push_back(
          GaugeMetric({{"device", key.second}, {"model", key.first}}, static_cast<double>(bytes)));
    }
    out.push_back(std::move(f));
  }
  {
    prometheus::MetricFamily f{
        "weightcache_load_progress_bytes",
        "Bytes of a model's entries on a device loaded so far (kind=done) and to load "
        "(kind=total), in every state but gone: done < total while loading (or failed part "
        "way).",
        prometheus::MetricType::Gauge,
        {}};
    for (const auto& [key, p] : progress) {
      f.metric.push_back(
          GaugeMetric({{"device", key.second}, {"kind", "done"}, {"model", key.first}},
                      static_cast<double>(p.first)));
      f.metric.push_back(
          GaugeMetric({{"device", key.second}, {"kind", "total"}, {"model", key.first}},
                      static_cast<double>(p.second)));
    }
    out.push_back(std::move(f));
  }
  {
    prometheus::MetricFamily f{
        "weightcache_leases", "Active client leases per model.", prometheus::MetricType::Gauge, {}};
    for (const auto& [model, n] : leases) {
      f.metric.push_back(GaugeMetric({{"model", model}}, static_cast<double>(n)));
    }
    out.push_back(std::move(f));
  }
  {
    prometheus::MetricFamily f{"weightcache_models",
                               "Cache entries by state (loading, ready, stale, draining, evicting, "
                               "failed, corrupt).",
                               prometheus::MetricType::Gauge,
                               {}};
    for (const char* s : kReportedStates) {
      f.metric.push_back(GaugeMetric({{"state", s}}, static_cast<double>(states[s])));
    }
    out.push_back(std::move(f));
  }
  {
    prometheus::MetricFamily f{
        "weightcache_device_memory_bytes",
        "Device memory: total and free as the device reports them, used by the cache.",
        prometheus::MetricType::Gauge,
        {}};
    for (const DeviceSnapshot& d : devices) {
      f.metric.push_back(GaugeMetric({{"device", d.device}, {"kind", "total"}},
                                     static_cast<double>(d.total_bytes)));
      f.metric.push_back(
          GaugeMetric({{"device", d.device}, {"kind", "free"}}, static_cast<double>(d.free_bytes)));
      f.metric.push_back(GaugeMetric({{"device", d.device}, {"kind", "used"}},
                                     static_cast<double>(d.cache_bytes)));
    }
    out.push_back(std::move(f));
  }
  {
    prometheus::MetricFamily f{
        "weightcache_memory_budget_bytes",
        "Memory the cache may hold on a device (--memory_budget); absent when unlimited.",
        prometheus::MetricType::Gauge,
        {}};
    for (const DeviceSnapshot& d : devices) {
      if (d.budget_bytes == 0) continue;
      f.metric.push_back(GaugeMetric({{"device", d.device}}, static_cast<double>(d.budget_bytes)));
    }
    out.push_back(std::move(f));
  }
  {
    prometheus::MetricFamily f{
        "weightcache_integrity_overdue_entries",
        "Ready entries whose segments have not all matched their digests for two scrub "
        "intervals and a minute: scrubbing is not keeping up, or fails (the log says why).",
        prometheus::MetricType::Gauge,
        {}};
    size_t overdue = 0;
    for (const EntrySnapshot& e : entries) overdue += e.verify_overdue ? 1 : 0;
    f.metric.push_back(GaugeMetric({}, static_cast<double>(overdue)));
    out.push_back(std::move(f));
  }
  if (staging.present) {
    prometheus::MetricFamily f{
        "weightcache_staging_pinned_bytes",
        "Page-locked host memory of the GPU loader's staging buffers: kept idle between "
        "loads, or in use by loads in progress.",
        prometheus::MetricType::Gauge,
        {}};
    f.metric.push_back(GaugeMetric({{"state", "idle"}}, static_cast<double>(staging.idle_bytes)));
    f.metric.push_back(
        GaugeMetric({{"state", "in_use"}}, static_cast<double>(staging.in_use_bytes)));
    out.push_back(std::move(f));
  }
  if (!listeners.empty()) AddListeners(listeners, &out);
  if (peer_port.present) AddPeerPort(peer_port, &out);
  return out;
}

}  // namespace weightcache::metrics::internal
