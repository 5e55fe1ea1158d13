// Compile-artifact puts in flight (issue 47). A put is a client stream: it holds a gRPC
// thread, and a reservation of the artifact budget, while it runs, and gRPC's synchronous
// API has no read timeout. So puts are counted, at most `max_per_unit` per tenant unit
// (tenant::Unit::Key(): a pod, a slot or a process, never a uid) and `max_total` in all,
// and a watchdog thread ends one that stalls (fewer than `progress_bytes` arrived in `idle`:
// a byte every few seconds is a stall, finding 4's trickle) or runs past `total`, by calling
// the cancel function its caller gave (the gRPC adapter's ServerContext::TryCancel, which
// makes the pending read return false). Knows nothing of gRPC or of artifacts.
//
// Thread-safety: every method may be called from any thread. `cancel` is called on the
// watchdog thread with the watch's lock held: it must not call back into the watch, and
// it is never called after End. Lifetimes: every ticket ends (End) before the watch is
// destroyed; the destructor joins the watchdog.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "pkg/tenant/unit.h"
#include "pkg/util/mutex.h"

namespace weightcache::server {

class PutWatch {
 public:
  struct Options {
    size_t max_total = 8;                     // --artifact_max_puts
    size_t max_per_unit = 2;                  // --artifact_max_puts_per_unit
    std::chrono::milliseconds idle{10000};    // --artifact_put_idle
    std::chrono::milliseconds total{300000};  // --artifact_put_total
    uint64_t progress_bytes = 64 << 10;       // what counts as progress within `idle`
  };
  explicit PutWatch(Options options);
  ~PutWatch();
  PutWatch(const PutWatch&) = delete;
  PutWatch& operator=(const PutWatch&) = delete;

  // A put of `unit` begins: its ticket. RESOURCE_EXHAUSTED naming the cap (the unit's, or
  // the total) when it is reached.
  absl::StatusOr<uint64_t> Begin(const tenant::Unit& unit, std::function<void()> cancel);
  // `bytes` more arrived.
  void Progress(uint64_t ticket, uint64_t bytes);
  // The stream ended (all bytes in): no longer watched for stalls, still counted until End.
  void Finished(uint64_t ticket);
  // The put is over. Why the watchdog ended it ("" when it did not).
  std::string End(uint64_t ticket);
  size_t in_flight() const;

 private:
  struct Put {
    std::string unit;
    std::function<void()> cancel;
    std::chrono::steady_clock::time_point began, last;
    uint64_t since_last = 0;  // bytes since `last`
    bool finished = false;
    std::string why;  // set when cancelled
  };
  void Run();

  const Options options_;
  mutable Mutex mu_;
  CondVar cv_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t next_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<uint64_t, Put> puts_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, size_t> per_unit_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;  // last: it starts once the rest is made
};

}  // namespace weightcache::server
