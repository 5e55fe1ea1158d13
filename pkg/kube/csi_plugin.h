// The CSI node plugin (CSI v1, Identity and Node services) that tells the daemon which pod a
// connection is for: the kubelet, not a guess from the peer's pid, names the pod.
//
// An engine pod carries an inline ephemeral volume of this driver (the webhook injects it);
// the driver's CSIDriver object asks for podInfoOnMount, so NodePublishVolume brings the pod's
// namespace, name, UID and service account in its volume context. `publish` then makes the
// volume: a directory at the target path holding that pod's own control and handle sockets
// (pkg/server/internal/pod_volumes.h). Every connection on them is that pod's.
//
// Life cycle: Start serves Identity and Node on `endpoint` (a Unix socket the kubelet dials),
// then, with `registration` set, the kubelet's plugin registration service on that socket in
// its plugins_registry directory: the kubelet's plugin watcher finds it, calls GetInfo
// (type CSIPlugin, the driver's name, the endpoint, CSI "1.0.0") and NotifyRegistrationStatus.
// Stop (or the destructor) stops both servers and removes both sockets.
//
// Requests are checked before `publish` runs: the volume must be ephemeral
// (csi.storage.k8s.io/ephemeral "true") with the pod's namespace, name and UID, and the target
// an absolute path under `pods_dir` (the kubelet's pods directory) without "..": otherwise
// INVALID_ARGUMENT naming what is wrong. Publishing a volume again is not an error (the kubelet
// retries); what `publish` returns decides.
//
// Thread-safety: Start/Stop/destructor from one thread; registered() from any. `publish` and
// `unpublish` run on gRPC threads, concurrently: they must be thread-safe.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "pkg/kube/pod_volume.h"

namespace grpc {
class Server;
}

namespace weightcache::kube {

inline constexpr char kCsiDriverName[] = "csi.weightcache.io";
// The volume context keys the kubelet sets with podInfoOnMount (a contract of Kubernetes).
inline constexpr char kCsiPodName[] = "csi.storage.k8s.io/pod.name";
inline constexpr char kCsiPodNamespace[] = "csi.storage.k8s.io/pod.namespace";
inline constexpr char kCsiPodUid[] = "csi.storage.k8s.io/pod.uid";
inline constexpr char kCsiServiceAccount[] = "csi.storage.k8s.io/serviceAccount.name";
inline constexpr char kCsiEphemeral[] = "csi.storage.k8s.io/ephemeral";

class CsiPlugin {
 public:
  struct Options {
    std::string driver_name = kCsiDriverName;
    std::string vendor_version;
    std::string node_id;   // NodeGetInfo: the node's name
    std::string endpoint;  // the CSI socket (created; removed by Stop)
    // The registration socket in the kubelet's plugins_registry directory; empty: none (the
    // endpoint is then served alone, as a test kubelet dials it).
    std::string registration;
    // The endpoint as the kubelet sees it, for GetInfo (empty: `endpoint`): the daemon's
    // container may see the host's directory at another path.
    std::string kubelet_endpoint;
    std::string pods_dir = "/var/lib/kubelet/pods";  // every target path lies under it
  };
  using PublishFn = std::function<absl::Status(const PodVolume& volume)>;
  using UnpublishFn =
      std::function<absl::Status(const std::string& volume_id, const std::string& target_path)>;

  // Checks the options (absolute paths, a driver name), serves. UNAVAILABLE naming the socket
  // when one cannot be served.
  static absl::StatusOr<std::unique_ptr<CsiPlugin>> Start(Options options, PublishFn publish,
                                                          UnpublishFn unpublish);
  ~CsiPlugin();
  CsiPlugin(const CsiPlugin&) = delete;
  CsiPlugin& operator=(const CsiPlugin&) = delete;
  void Stop();

  // The kubelet told NotifyRegistrationStatus that the plugin is registered (and no error
  // since); the last error it told, if any.
  bool registered() const;
  std::string registration_error() const;
  const Options& options() const { return options_; }

  // The pod volume a NodePublishVolume request describes, checked as the file comment says.
  // Exposed for tests; the server calls it.
  static absl::StatusOr<PodVolume> VolumeOf(const std::string& volume_id,
                                            const std::string& target_path,
                                            const std::map<std::string, std::string>& context,
                                            const std::string& pods_dir);

  class Services;  // the gRPC services, defined in csi_plugin.cc

 private:
  explicit CsiPlugin(Options options);
  const Options options_;
  std::unique_ptr<Services> services_;
  std::unique_ptr<grpc::Server> csi_;
  std::unique_ptr<grpc::Server> registrar_;
};

}  // namespace weightcache::kube
