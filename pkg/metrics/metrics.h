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
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace prometheus {
class Registry;
}

namespace weightcache::metrics {

enum class AcquireResult { kHit, kMiss, kMismatch, kRejected, kError, kPeerCopy };
const char* AcquireResultName(AcquireResult r);  // "hit", "miss", ...

struct EntrySnapshot {
  std::string model;
  std::string state;   // loading | ready | evicting | gone | failed
  std::string device;  // GPU UUID or "host"
  uint64_t bytes = 0;
  uint64_t leases = 0;
};
struct DeviceSnapshot {
  std::string device;  // GPU UUID or "host"
  uint64_t total_bytes = 0;
  uint64_t free_bytes = 0;
  uint64_t cache_bytes = 0;  // used by the cache
};

// What the scrape-time gauges read. Implemented by the registry owner (the server).
class StateSource {
 public:
  virtual ~StateSource() = default;
  virtual std::vector<EntrySnapshot> Entries() const = 0;
  virtual std::vector<DeviceSnapshot> Devices() const = 0;
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

  // Attach the scrape-time source (call once, before serving). May stay unset in tests.
  void SetStateSource(const StateSource* source);

  void OnAcquire(const std::string& model, AcquireResult result, double seconds);
  void OnLoad(const std::string& model, const std::string& source /* disk|keeper|peer */,
              double seconds, uint64_t bytes);
  void OnEviction(const std::string& model, const std::string& reason /* api|budget */);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace weightcache::metrics
