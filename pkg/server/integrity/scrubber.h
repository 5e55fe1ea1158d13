// The integrity scrubber (issue 27, docs/integrity.md). One thread runs a pass every
// `interval`: each ready entry's segments (and each draining one's, while leases map it and
// it is not corrupt) are digested again (integrity::DigestSegment: a
// kernel on a lowest-priority stream on GPUs, the CPU on the host backend) at most
// `bytes_per_second`, and compared with the digests the registry took when the entry was
// filled. A difference is handed to `on_corrupt` with the segments and byte ranges that
// changed; the daemon takes the entry out of service. Verify() runs the same check at once
// for one entry (VerifyResident). Not a public header.
//
// Thread-safety: Verify may be called from any thread, also during a pass. Lifetimes: the
// registry and metrics passed in outlive the scrubber; the destructor stops the thread.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "pkg/cache/registry.h"
#include "pkg/integrity/segment_digest.h"
#include "pkg/memory/backend.h"
#include "pkg/util/mutex.h"

namespace weightcache::metrics {
class Metrics;
}

namespace weightcache::server {

class Scrubber {
 public:
  struct Options {
    std::chrono::milliseconds interval{30000};  // between pass starts; 0: no thread
    double bytes_per_second = 50e9;             // 0: unthrottled
  };
  // `what`: "segment 3 of 8 (1073741824 bytes on GPU-...): bytes [a, b) changed; ...".
  using CorruptFn = std::function<void(const std::shared_ptr<cache::Entry>&, const std::string&)>;
  // Tests only (DaemonHooks::BeforeDigestCompare); empty in production.
  using DigestHook =
      std::function<void(const std::string& model, size_t segment, std::vector<uint64_t>*)>;

  struct Result {
    enum class Kind { kClean, kCorrupt, kError };
    Kind kind = Kind::kError;
    std::string detail;  // corrupt: what changed; error: why no verdict
    uint64_t bytes = 0;  // digested
    size_t segments = 0;
    double seconds = 0;
  };

  Scrubber(Options options, memory::BackendKind kind, cache::Registry& registry,
           metrics::Metrics* metrics, CorruptFn on_corrupt, DigestHook hook);
  ~Scrubber();
  Scrubber(const Scrubber&) = delete;
  Scrubber& operator=(const Scrubber&) = delete;

  // Starts the pass thread (when interval > 0). Once.
  void Start();
  // Stops the thread; a digest in progress ends at its next piece. Idempotent.
  void Stop();

  // Digests `e` now at `bytes_per_second` (0: unthrottled) and compares: clean (the entry is
  // marked verified), corrupt (on_corrupt was called), or error (neither ready nor watched
  // while draining, no digests, a device error, stopped).
  Result Verify(const std::shared_ptr<cache::Entry>& e, double bytes_per_second);

  // Scrub passes completed since start.
  uint64_t passes() const;

 private:
  void Loop();
  bool stopping() const;

  const Options options_;
  const memory::BackendKind kind_;
  cache::Registry& registry_;
  metrics::Metrics* const metrics_;
  const CorruptFn on_corrupt_;
  const DigestHook hook_;
  mutable Mutex mu_;
  CondVar cv_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t passes_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread thread_;
};

}  // namespace weightcache::server
