// A client of the kubelet's PodResources API (v1.PodResourcesLister/List on
// /var/lib/kubelet/pod-resources/kubelet.sock): which pod's container holds which device of an
// extended resource. The daemon uses it to learn which pod holds a device-plugin slot, and so
// in which namespace a connection on that slot's socket runs (pkg/server/policy/namespace_rules.h).
// It needs neither hostPID nor the API server: the kubelet answers for its own node.
//
// Thread-safety: Holders() may be called from any thread at once (one gRPC channel, shared).
// Lifetimes: plain values out; the client owns its channel.
#pragma once

#include <map>
#include <memory>
#include <set>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "pkg/util/mutex.h"

namespace grpc {
class Channel;
}

namespace weightcache::kube {

inline constexpr char kDefaultPodResourcesSocket[] = "/var/lib/kubelet/pod-resources/kubelet.sock";

struct PodRef {
  std::string ns;         // the pod's namespace
  std::string name;       // the pod's name
  std::string container;  // the container that was allocated the device
  bool operator==(const PodRef&) const = default;
};

// Device id -> the pod holding it, for one resource. A device id reported for two different
// pods (the kubelet should never do that) is in `conflicting` and not in `by_device`: callers
// must treat it as unknown (fail closed).
struct DeviceHolders {
  std::map<std::string, PodRef> by_device;
  std::set<std::string> conflicting;
};

class PodResourcesClient {
 public:
  struct Options {
    std::string socket = kDefaultPodResourcesSocket;
    absl::Duration timeout = absl::Seconds(2);  // of one List call
  };
  // INVALID_ARGUMENT for a relative or too long socket path. Does not connect yet.
  static absl::StatusOr<std::unique_ptr<PodResourcesClient>> Create(Options options);
  ~PodResourcesClient();
  PodResourcesClient(const PodResourcesClient&) = delete;
  PodResourcesClient& operator=(const PodResourcesClient&) = delete;

  // One List call: every device of `resource_name` allocated to a container on this node.
  // UNAVAILABLE (or the kubelet's code) naming the socket and the cause when the kubelet
  // cannot be asked. After an UNAVAILABLE the next call dials afresh (a restarted kubelet is
  // asked at once, not after gRPC's reconnect back-off).
  absl::StatusOr<DeviceHolders> Holders(const std::string& resource_name) const;

  const Options& options() const { return options_; }

 private:
  explicit PodResourcesClient(Options options);
  std::shared_ptr<grpc::Channel> Dial() const;
  const Options options_;
  mutable Mutex mu_;
  mutable std::shared_ptr<grpc::Channel> channel_ ABSL_GUARDED_BY(mu_);
};

}  // namespace weightcache::kube
