// The daemon's one seam for tests: points in the middle of its work where a test acts, to
// race an eviction deterministically, to hold a preload in its opening, or to model a change
// that the host backend's sealed memory cannot have. A production daemon has none (every
// point is skipped); only pkg/server/testing/hooks.h can start a daemon with hooks, so no
// option, flag or config can set them.
//
// Thread-safety: each method is called on the thread doing that work (a gRPC thread, the
// preload thread, the scrubber's thread), possibly concurrently. Lifetimes: the hooks outlive
// the daemon they were given to.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace weightcache::server {

class DaemonHooks {
 public:
  virtual ~DaemonHooks() = default;
  // Acquire found a ready entry of `model` and has not recorded the lease yet.
  virtual void BeforeLease(const std::string& /*model*/) {}
  // The preload thread is about to open `model` (which may hash its files for minutes).
  virtual void BeforePreload(const std::string& /*model*/) {}
  // A check (scrub or verify) took `chunks`, the digest of `segment` of an entry of `model`,
  // and is about to compare it with the one taken when the entry was filled.
  virtual void BeforeDigestCompare(const std::string& /*model*/, size_t /*segment*/,
                                   std::vector<uint64_t>* /*chunks*/) {}
};

}  // namespace weightcache::server
