#include "pkg/kube/pod_resources.h"

#include <sys/un.h>

#include <chrono>

#include "absl/strings/str_cat.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "podresources/v1/api.grpc.pb.h"
#include "podresources/v1/api.pb.h"

namespace weightcache::kube {
namespace {

// A node with hundreds of pods answers in well under a megabyte; bound it anyway.
constexpr int kMaxResponseBytes = 16 << 20;

}  // namespace

absl::StatusOr<std::unique_ptr<PodResourcesClient>> PodResourcesClient::Create(Options options) {
  if (options.socket.empty() || options.socket[0] != '/') {
    return absl::InvalidArgumentError("pod resources: socket must be an absolute path: \"" +
                                      options.socket + "\"");
  }
  if (options.socket.size() >= sizeof(sockaddr_un::sun_path)) {
    return absl::InvalidArgumentError(
        absl::StrCat("pod resources: socket path ", options.socket, " is ", options.socket.size(),
                     " bytes; Unix sockets allow ", sizeof(sockaddr_un::sun_path) - 1));
  }
  if (options.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("pod resources: timeout must be positive");
  }
  return std::unique_ptr<PodResourcesClient>(new PodResourcesClient(std::move(options)));
}

PodResourcesClient::PodResourcesClient(Options options) : options_(std::move(options)) {
  MutexLock l(mu_);
  channel_ = Dial();
}

std::shared_ptr<grpc::Channel> PodResourcesClient::Dial() const {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxResponseBytes);
  return grpc::CreateCustomChannel("unix:" + options_.socket, grpc::InsecureChannelCredentials(),
                                   args);
}

PodResourcesClient::~PodResourcesClient() = default;

absl::StatusOr<DeviceHolders> PodResourcesClient::Holders(const std::string& resource_name) const {
  std::shared_ptr<grpc::Channel> channel;
  {
    MutexLock l(mu_);
    channel = channel_;
  }
  auto stub = ::v1::PodResourcesLister::NewStub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(options_.timeout));
  ::v1::ListPodResourcesRequest req;
  ::v1::ListPodResourcesResponse resp;
  const grpc::Status s = stub->List(&ctx, req, &resp);
  if (!s.ok()) {
    if (s.error_code() == grpc::StatusCode::UNAVAILABLE) {
      MutexLock l(mu_);
      if (channel_ == channel) channel_ = Dial();
    }
    return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                        absl::StrCat("kubelet PodResources API (", options_.socket,
                                     "): List: ", s.error_message()));
  }
  DeviceHolders out;
  for (const auto& pod : resp.pod_resources()) {
    for (const auto& c : pod.containers()) {
      for (const auto& d : c.devices()) {
        if (d.resource_name() != resource_name) continue;
        for (const std::string& id : d.device_ids()) {
          if (out.conflicting.count(id) != 0) continue;
          PodRef ref{pod.namespace_(), pod.name(), c.name()};
          auto [it, inserted] = out.by_device.emplace(id, ref);
          // Init and app containers of one pod may share a device; two pods may not.
          if (!inserted && (it->second.ns != ref.ns || it->second.name != ref.name)) {
            out.by_device.erase(it);
            out.conflicting.insert(id);
          }
        }
      }
    }
  }
  return out;
}

}  // namespace weightcache::kube
