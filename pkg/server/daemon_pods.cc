// The CSI plugin's calls on the daemon: a pod's own sockets, made by its pod volumes
// (wire/pod_volumes.h), which the daemon's core owns and stops before its listeners.
#include "pkg/server/daemon.h"
#include "pkg/server/wire/pod_volumes.h"

namespace weightcache::server {

absl::Status Daemon::PublishPodVolume(const kube::PodVolume& volume) {
  return pod_volumes_->Publish(volume);
}

absl::Status Daemon::UnpublishPodVolume(const std::string& volume_id,
                                        const std::string& target_path) {
  return pod_volumes_->Unpublish(volume_id, target_path);
}

}  // namespace weightcache::server
