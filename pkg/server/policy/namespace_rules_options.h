// The namespace rules' options: vocabulary that the daemon's options (options.h) and the
// rules themselves (namespace_rules.h) share, so the policy folder depends on nothing of the
// daemon's core.
//
// Thread-safety: plain values.
#pragma once

#include <chrono>
#include <string>

namespace weightcache::server {

// Per-model namespace rules (docs/security.md, pkg/server/policy/namespace_rules.h). With
// `enabled`, the daemon also serves one socket directory per device-plugin slot,
// <socket_dir>/slots/weightcache-<i>/ (control.sock, handle.sock), and asks the kubelet's
// PodResources API which pod holds the slot of a connection before it maps a model that lists
// allowed_namespaces.
struct NamespaceRulesOptions {
  bool enabled = false;
  int slots = 64;  // the device plugin's slots (--device_plugin_slots)
  std::string resource_name = "weightcache.io/client";
  std::string pod_resources_socket = "/var/lib/kubelet/pod-resources/kubelet.sock";
  // Where a slot's directory appears in engine containers (--container_socket_dir): the
  // handle socket named in Acquire answers on slot connections. Empty: socket_dir.
  std::string container_socket_dir;
  std::chrono::milliseconds cache_ttl{2000};
  std::chrono::milliseconds pod_resources_timeout{2000};
};

}  // namespace weightcache::server
