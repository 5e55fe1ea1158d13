// A pod's weightcache volume, as the kubelet describes it to the CSI node plugin
// (csi_plugin.h) when it publishes the volume: which pod the volume is for, named by the
// kubelet itself (podInfoOnMount), and where the volume goes. The vocabulary the plugin and
// the daemon's pod sockets (pkg/server) share; depends on nothing.
//
// Thread-safety: a plain value, copied freely.
#pragma once

#include <string>

namespace weightcache::kube {

struct PodVolume {
  std::string volume_id;    // the kubelet's id of the inline volume ("csi-<hash>")
  std::string target_path;  // the directory the kubelet asks the volume in (on the host)
  std::string pod_namespace;
  std::string pod_name;
  std::string pod_uid;
  std::string service_account;
  bool operator==(const PodVolume&) const = default;
};

}  // namespace weightcache::kube
