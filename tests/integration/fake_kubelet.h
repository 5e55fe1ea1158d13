// A fake kubelet for tests of the namespace rules: the PodResources API (real gRPC on a Unix
// socket) as far as weightcached reads it, answering which pod holds which device-plugin slot.
#pragma once

#include <grpcpp/grpcpp.h>

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "podresources/v1/api.grpc.pb.h"

namespace weightcache::testing {

// The kubelet's PodResources API as far as weightcached reads it: slot -> pod, changeable.
class FakeKubelet final : public ::v1::PodResourcesLister::Service {
 public:
  explicit FakeKubelet(const std::string& socket) {
    grpc::ServerBuilder b;
    b.AddListeningPort("unix:" + socket, grpc::InsecureServerCredentials());
    b.RegisterService(this);
    server_ = b.BuildAndStart();
  }
  ~FakeKubelet() override { Stop(); }
  bool serving() const { return server_ != nullptr; }
  void Stop() {
    if (server_) server_->Shutdown();
    server_.reset();
  }
  // Slot (device id) -> {namespace, pod}; a slot absent is held by no pod.
  void Assign(const std::string& slot, const std::string& ns, const std::string& pod) {
    std::lock_guard<std::mutex> l(mu_);
    holders_[slot] = {ns, pod};
  }
  int lists() {
    std::lock_guard<std::mutex> l(mu_);
    return lists_;
  }

  grpc::Status List(grpc::ServerContext*, const ::v1::ListPodResourcesRequest*,
                    ::v1::ListPodResourcesResponse* resp) override {
    std::lock_guard<std::mutex> l(mu_);
    ++lists_;
    // An unrelated pod with another resource, as on a real node.
    auto* gpu = resp->add_pod_resources();
    gpu->set_name("trainer");
    gpu->set_namespace_("team-b");
    auto* gc = gpu->add_containers();
    gc->set_name("main");
    auto* gd = gc->add_devices();
    gd->set_resource_name("nvidia.com/gpu");
    gd->add_device_ids("weightcache-1");  // same id, other resource: must not count
    for (const auto& [slot, who] : holders_) {
      auto* p = resp->add_pod_resources();
      p->set_namespace_(who.first);
      p->set_name(who.second);
      auto* c = p->add_containers();
      c->set_name("engine");
      auto* d = c->add_devices();
      d->set_resource_name("weightcache.io/client");
      d->add_device_ids(slot);
    }
    return grpc::Status::OK;
  }

 private:
  std::unique_ptr<grpc::Server> server_;
  std::mutex mu_;
  std::map<std::string, std::pair<std::string, std::string>> holders_;
  int lists_ = 0;
};

}  // namespace weightcache::testing
