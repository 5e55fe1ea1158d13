// weightcached's flags (flags.cc): the daemon's options, its memory backend and budget read
// from them, and the flags the main reads itself. Every refusal names the flag.
#pragma once

#include <memory>
#include <string>

#include "absl/flags/declare.h"
#include "absl/status/statusor.h"
#include "pkg/memory/backend.h"
#include "pkg/server/options.h"

ABSL_DECLARE_FLAG(std::string, metrics_address);
ABSL_DECLARE_FLAG(bool, verbose);
ABSL_DECLARE_FLAG(bool, device_plugin);
ABSL_DECLARE_FLAG(std::string, kubelet_dir);
ABSL_DECLARE_FLAG(int, device_plugin_slots);
ABSL_DECLARE_FLAG(std::string, device_plugin_resource);
ABSL_DECLARE_FLAG(std::string, csi_endpoint);
ABSL_DECLARE_FLAG(std::string, csi_registration_dir);
ABSL_DECLARE_FLAG(std::string, csi_pods_dir);
ABSL_DECLARE_FLAG(std::string, node_name);

namespace weightcache {

struct Options {
  server::DaemonOptions daemon;  // all but the memory budget (SetMemoryBudget)
  double shutdown_timeout = 0;   // seconds
};

// The daemon's options from the flags, in the order the flags were always checked in: an
// error names the first bad flag. Raises the open-file limit on the way.
absl::StatusOr<Options> OptionsFromFlags();
// The memory backend --backend names (with --host_devices, --host_max_segment_bytes).
absl::StatusOr<std::unique_ptr<memory::Backend>> BackendFromFlags();
// --memory_budget, which may be a share of the smallest device's memory of `backend`.
absl::Status SetMemoryBudget(const memory::Backend& backend, server::DaemonOptions& opts);

}  // namespace weightcache
