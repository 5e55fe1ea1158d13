// The daemon's pod volumes (wire/pod_volumes.h): the CSI plugin's publish and unpublish, made
// into a pod's own sockets on the control listener and the handle channel.
#include "pkg/server/internal/daemon_impl.h"

namespace weightcache::server {

absl::Status Daemon::Impl::StartPodVolumes() {
  pod_volumes_ =
      std::make_unique<PodVolumes>(options_.pod_volumes_file, control_.get(), handles_.get());
  return pod_volumes_->Restore();
}

absl::Status Daemon::PublishPodVolume(const kube::PodVolume& volume) {
  return impl_->pod_volumes().Publish(volume);
}

absl::Status Daemon::UnpublishPodVolume(const std::string& volume_id,
                                        const std::string& target_path) {
  return impl_->pod_volumes().Unpublish(volume_id, target_path);
}

}  // namespace weightcache::server
