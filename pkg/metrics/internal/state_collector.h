// The scrape-time families (entries by state, devices, staging, listeners, the peer port):
// what a StateSource says at each scrape, as Prometheus families. Private to pkg/metrics.
//
// Thread-safety: SetSource and SetMoreListeners from any thread; Collect from the scraping
// threads. The lock is held across the calls into the source, so SetSource(nullptr) waits for
// a scrape in progress.
#pragma once

#include <functional>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "pkg/metrics/metrics.h"
#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"

namespace weightcache::metrics::internal {

// Scrape-time gauges computed from a StateSource.
class StateCollector final : public prometheus::Collectable {
 public:
  void SetSource(const StateSource* source) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    source_ = source;
  }
  void SetMoreListeners(std::function<std::vector<ListenerSnapshot>()> more)
      ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    more_listeners_ = std::move(more);
  }

  // Called from scraping threads. The lock is held across the calls into the source so that
  // SetSource(nullptr) (from ~Metrics) waits for a scrape in progress.
  std::vector<prometheus::MetricFamily> Collect() const override ABSL_LOCKS_EXCLUDED(mu_);

 private:
  mutable absl::Mutex mu_;
  const StateSource* source_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::function<std::vector<ListenerSnapshot>()> more_listeners_ ABSL_GUARDED_BY(mu_);
};

}  // namespace weightcache::metrics::internal
