// Starting a daemon with test hooks (pkg/server/hooks.h), and hooks made of functions. The
// only door to Daemon's hooked start: production code has no way to set hooks. Test-only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "pkg/memory/backend.h"
#include "pkg/server/daemon.h"
#include "pkg/server/hooks.h"

namespace weightcache::server::testing {

// Each function, when set, runs at its point (DaemonHooks says where).
struct FunctionHooks : DaemonHooks {
  std::function<void(const std::string& model)> before_lease;
  std::function<void(const std::string& model)> before_preload;
  std::function<void(const std::string& model, size_t segment, std::vector<uint64_t>* chunks)>
      before_digest_compare;

  void BeforeLease(const std::string& model) override {
    if (before_lease) before_lease(model);
  }
  void BeforePreload(const std::string& model) override {
    if (before_preload) before_preload(model);
  }
  void BeforeDigestCompare(const std::string& model, size_t segment,
                           std::vector<uint64_t>* chunks) override {
    if (before_digest_compare) before_digest_compare(model, segment, chunks);
  }
};

class DaemonHooksAccess {
 public:
  // Daemon::Start with `hooks` (null: none); `hooks` outlives the daemon.
  static absl::StatusOr<std::unique_ptr<Daemon>> Start(DaemonOptions options,
                                                       memory::Backend* backend,
                                                       DaemonHooks* hooks) {
    return Daemon::StartWithHooks(std::move(options), backend, hooks);
  }
};

}  // namespace weightcache::server::testing
