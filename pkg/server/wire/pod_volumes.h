// Pod volumes: what the CSI node plugin (pkg/kube/csi_plugin.h) publishes, made into a pod's
// own sockets. Publishing a pod's volume creates its directory (the kubelet's target path) with
// control.sock and handle.sock in it, served by the control listener and the handle channel
// as that pod's: every connection on them is the pod the kubelet named, whatever the process.
// One volume per pod (its containers share it); a second volume of the same pod is refused,
// naming the first. Unpublishing removes the sockets and the directory; connections already
// open stay until they end.
//
// The volumes are recorded in `state_file` (JSON, written whole to a temporary file and
// renamed): a daemon that restarts serves again the sockets of the volumes it published, since
// the kubelet publishes a running pod's volume only once. A recorded volume whose directory is
// gone (the pod ended meanwhile) is forgotten.
//
// Thread-safety: every method from any thread (the plugin's gRPC threads). Lifetimes: the
// listener and the channel outlive this object.
#pragma once

#include <cstddef>
#include <map>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "pkg/kube/pod_volume.h"
#include "pkg/server/wire/control_listener.h"
#include "pkg/server/wire/handle_channel.h"
#include "pkg/util/mutex.h"

namespace weightcache::server {

class PodVolumes {
 public:
  // `state_file` empty: nothing is recorded (tests).
  PodVolumes(std::string state_file, ControlListener* control, HandleChannel* handles);
  PodVolumes(const PodVolumes&) = delete;
  PodVolumes& operator=(const PodVolumes&) = delete;

  // Serves again the volumes recorded in the state file whose directories still exist. A
  // state file that cannot be read is an error naming it (nothing is served or lost).
  absl::Status Restore();
  // Idempotent for the same volume and target (the kubelet retries).
  absl::Status Publish(const kube::PodVolume& volume);
  // An unknown volume is not an error (CSI: the kubelet may ask again).
  absl::Status Unpublish(const std::string& volume_id, const std::string& target_path);
  size_t size() const;
  // From now on Publish and Unpublish answer UNAVAILABLE (the daemon is stopping: its
  // listeners are about to go). The sockets already served are the listeners' to close.
  void Stop();

 private:
  absl::Status Serve(const kube::PodVolume& v);
  void StopServing(const kube::PodVolume& v);
  absl::Status Save() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string state_file_;
  ControlListener* const control_;
  HandleChannel* const handles_;
  mutable Mutex mu_;
  std::map<std::string, kube::PodVolume> volumes_ ABSL_GUARDED_BY(mu_);  // by volume id
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace weightcache::server
