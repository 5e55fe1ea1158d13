// Test-only: one sample of a metric family in a prometheus::Registry, for tests of the
// daemon's metrics in process.
#pragma once

#include <prometheus/registry.h>

#include <map>
#include <string>

namespace weightcache::server::testing {

// The value of metric `name` whose labels include `labels` (a counter's or gauge's value, a
// histogram's sample count); `missing` when no such series exists.
inline double Sample(const prometheus::Registry& registry, const std::string& name,
                     const std::map<std::string, std::string>& labels = {}, double missing = -1) {
  for (const auto& f : registry.Collect()) {
    if (f.name != name) continue;
    for (const auto& m : f.metric) {
      size_t matched = 0;
      for (const auto& l : m.label) matched += labels.count(l.name) && labels.at(l.name) == l.value;
      if (matched != labels.size()) continue;
      switch (f.type) {
        case prometheus::MetricType::Gauge:
          return m.gauge.value;
        case prometheus::MetricType::Histogram:
          return static_cast<double>(m.histogram.sample_count);
        default:
          return m.counter.value;
      }
    }
  }
  return missing;
}

}  // namespace weightcache::server::testing
