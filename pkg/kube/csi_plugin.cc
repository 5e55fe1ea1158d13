#include "pkg/kube/csi_plugin.h"

#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <filesystem>
#include <map>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "csi/v1/csi.grpc.pb.h"
#include "pkg/util/log.h"
#include "pkg/util/mutex.h"
#include "pluginregistration/v1/api.grpc.pb.h"

namespace weightcache::kube {
namespace {

grpc::Status ToGrpc(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

// Whether `path` lies under `dir` (both absolute, lexically normal): no "..", no escape.
bool Under(const std::string& path, const std::string& dir) {
  const std::filesystem::path p(path);
  if (!p.is_absolute() || p.lexically_normal() != p) return false;
  for (const auto& part : p) {
    if (part == "..") return false;
  }
  std::string prefix = std::filesystem::path(dir).lexically_normal().string();
  if (!prefix.empty() && prefix.back() != '/') prefix += '/';
  return absl::StartsWith(path, prefix) && path.size() > prefix.size();
}

}  // namespace

class CsiPlugin::Services final : public csi::v1::Identity::Service,
                                  public csi::v1::Node::Service,
                                  public pluginregistration::Registration::Service {
 public:
  Services(const Options& o, PublishFn publish, UnpublishFn unpublish)
      : o_(o), publish_(std::move(publish)), unpublish_(std::move(unpublish)) {}

  // Identity.
  grpc::Status GetPluginInfo(grpc::ServerContext*, const csi::v1::GetPluginInfoRequest*,
                             csi::v1::GetPluginInfoResponse* out) override {
    out->set_name(o_.driver_name);
    out->set_vendor_version(o_.vendor_version);
    return grpc::Status::OK;
  }
  grpc::Status GetPluginCapabilities(grpc::ServerContext*,
                                     const csi::v1::GetPluginCapabilitiesRequest*,
                                     csi::v1::GetPluginCapabilitiesResponse*) override {
    return grpc::Status::OK;  // a node plugin only: no controller service, no topology
  }
  grpc::Status Probe(grpc::ServerContext*, const csi::v1::ProbeRequest*,
                     csi::v1::ProbeResponse* out) override {
    out->mutable_ready()->set_value(true);
    return grpc::Status::OK;
  }

  // Node.
  grpc::Status NodeGetInfo(grpc::ServerContext*, const csi::v1::NodeGetInfoRequest*,
                           csi::v1::NodeGetInfoResponse* out) override {
    out->set_node_id(o_.node_id);
    return grpc::Status::OK;
  }
  grpc::Status NodeGetCapabilities(grpc::ServerContext*, const csi::v1::NodeGetCapabilitiesRequest*,
                                   csi::v1::NodeGetCapabilitiesResponse*) override {
    return grpc::Status::OK;  // no staging, no stats, no expansion
  }
  grpc::Status NodePublishVolume(grpc::ServerContext*, const csi::v1::NodePublishVolumeRequest* in,
                                 csi::v1::NodePublishVolumeResponse*) override {
    const std::map<std::string, std::string> context(in->volume_context().begin(),
                                                     in->volume_context().end());
    auto volume = VolumeOf(in->volume_id(), in->target_path(), context, o_.pods_dir);
    if (!volume.ok()) return ToGrpc(volume.status());
    absl::Status s = publish_(*volume);
    if (s.ok()) {
      WC_LOG_INFO("csi: published %s for pod %s/%s (%s) at %s", volume->volume_id,
                  volume->pod_namespace, volume->pod_name, volume->pod_uid, volume->target_path);
    } else {
      WC_LOG_WARN("csi: publishing %s for pod %s/%s: %s", volume->volume_id, volume->pod_namespace,
                  volume->pod_name, std::string(s.message()));
    }
    return ToGrpc(s);
  }
  grpc::Status NodeUnpublishVolume(grpc::ServerContext*,
                                   const csi::v1::NodeUnpublishVolumeRequest* in,
                                   csi::v1::NodeUnpublishVolumeResponse*) override {
    if (in->volume_id().empty()) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "NodeUnpublishVolume: no volume_id");
    }
    if (!Under(in->target_path(), o_.pods_dir)) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          absl::StrCat("NodeUnpublishVolume: target_path '", in->target_path(),
                                       "' is not a path under ", o_.pods_dir));
    }
    return ToGrpc(unpublish_(in->volume_id(), in->target_path()));
  }

  // Plugin registration.
  grpc::Status GetInfo(grpc::ServerContext*, const pluginregistration::InfoRequest*,
                       pluginregistration::PluginInfo* out) override {
    out->set_type("CSIPlugin");
    out->set_name(o_.driver_name);
    out->set_endpoint(o_.kubelet_endpoint.empty() ? o_.endpoint : o_.kubelet_endpoint);
    out->add_supported_versions("1.0.0");
    return grpc::Status::OK;
  }
  grpc::Status NotifyRegistrationStatus(grpc::ServerContext*,
                                        const pluginregistration::RegistrationStatus* in,
                                        pluginregistration::RegistrationStatusResponse*) override {
    {
      MutexLock l(mu_);
      registered_ = in->plugin_registered();
      error_ = in->error();
    }
    if (in->plugin_registered()) {
      WC_LOG_INFO("csi: the kubelet registered driver %s", o_.driver_name);
    } else {
      WC_LOG_ERROR("csi: the kubelet did not register driver %s: %s", o_.driver_name, in->error());
    }
    return grpc::Status::OK;
  }

  bool registered() const {
    MutexLock l(mu_);
    return registered_;
  }
  std::string error() const {
    MutexLock l(mu_);
    return error_;
  }

 private:
  const Options& o_;
  const PublishFn publish_;
  const UnpublishFn unpublish_;
  mutable Mutex mu_;
  bool registered_ ABSL_GUARDED_BY(mu_) = false;
  std::string error_ ABSL_GUARDED_BY(mu_);
};

absl::StatusOr<PodVolume> CsiPlugin::VolumeOf(const std::string& volume_id,
                                              const std::string& target_path,
                                              const std::map<std::string, std::string>& context,
                                              const std::string& pods_dir) {
  auto get = [&](const char* key) -> std::string {
    auto it = context.find(key);
    return it == context.end() ? std::string() : it->second;
  };
  if (volume_id.empty()) return absl::InvalidArgumentError("NodePublishVolume: no volume_id");
  if (!Under(target_path, pods_dir)) {
    return absl::InvalidArgumentError(absl::StrCat("NodePublishVolume: target_path '", target_path,
                                                   "' is not a path under ", pods_dir));
  }
  if (get(kCsiEphemeral) != "true") {
    return absl::InvalidArgumentError(absl::StrCat(
        "NodePublishVolume ", volume_id, ": not an inline ephemeral volume (", kCsiEphemeral,
        " is '", get(kCsiEphemeral), "'): a weightcache volume is declared in the pod spec"));
  }
  PodVolume v;
  v.volume_id = volume_id;
  v.target_path = target_path;
  v.pod_namespace = get(kCsiPodNamespace);
  v.pod_name = get(kCsiPodName);
  v.pod_uid = get(kCsiPodUid);
  v.service_account = get(kCsiServiceAccount);
  for (const auto& [key, value] :
       {std::pair<const char*, const std::string&>{kCsiPodNamespace, v.pod_namespace},
        {kCsiPodName, v.pod_name},
        {kCsiPodUid, v.pod_uid}}) {
    if (value.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("NodePublishVolume ", volume_id, ": the volume context has no ", key,
                       " (the CSIDriver object must set podInfoOnMount: true)"));
    }
  }
  for (char c : v.pod_uid) {
    if (!(std::isxdigit(static_cast<unsigned char>(c)) || c == '-')) {
      return absl::InvalidArgumentError(absl::StrCat("NodePublishVolume ", volume_id, ": pod UID '",
                                                     v.pod_uid, "' is not a UID"));
    }
  }
  return v;
}

CsiPlugin::CsiPlugin(Options options) : options_(std::move(options)) {}

absl::StatusOr<std::unique_ptr<CsiPlugin>> CsiPlugin::Start(Options options, PublishFn publish,
                                                            UnpublishFn unpublish) {
  for (const auto& [flag, path] :
       {std::pair<const char*, const std::string&>{"endpoint", options.endpoint},
        {"pods_dir", options.pods_dir}}) {
    if (path.empty() || path[0] != '/') {
      return absl::InvalidArgumentError(
          absl::StrCat("CSI plugin: ", flag, " '", path, "' is not an absolute path"));
    }
  }
  if (!options.registration.empty() && options.registration[0] != '/') {
    return absl::InvalidArgumentError(absl::StrCat(
        "CSI plugin: registration '", options.registration, "' is not an absolute path"));
  }
  if (options.driver_name.empty()) return absl::InvalidArgumentError("CSI plugin: no driver name");
  auto p = std::unique_ptr<CsiPlugin>(new CsiPlugin(std::move(options)));
  p->services_ = std::make_unique<Services>(p->options_, std::move(publish), std::move(unpublish));
  auto serve = [&](const std::string& path, std::initializer_list<grpc::Service*> services)
      -> absl::StatusOr<std::unique_ptr<grpc::Server>> {
    std::error_code ec;
    std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
    ::unlink(path.c_str());  // a previous run's socket: the kubelet dials the path anew
    grpc::ServerBuilder b;
    b.AddListeningPort("unix:" + path, grpc::InsecureServerCredentials());
    for (grpc::Service* s : services) b.RegisterService(s);
    std::unique_ptr<grpc::Server> server = b.BuildAndStart();
    if (!server) return absl::UnavailableError("CSI plugin: cannot serve gRPC on unix:" + path);
    return server;
  };
  auto* s = p->services_.get();
  auto csi = serve(p->options_.endpoint, {static_cast<csi::v1::Identity::Service*>(s),
                                          static_cast<csi::v1::Node::Service*>(s)});
  if (!csi.ok()) return csi.status();
  p->csi_ = std::move(csi).value();
  if (!p->options_.registration.empty()) {
    auto reg = serve(p->options_.registration,
                     {static_cast<pluginregistration::Registration::Service*>(s)});
    if (!reg.ok()) return reg.status();
    p->registrar_ = std::move(reg).value();
  }
  WC_LOG_INFO("csi: driver %s serving on %s%s", p->options_.driver_name, p->options_.endpoint,
              p->options_.registration.empty()
                  ? std::string()
                  : absl::StrCat(", registration on ", p->options_.registration));
  return p;
}

CsiPlugin::~CsiPlugin() { Stop(); }

void CsiPlugin::Stop() {
  // The registration socket first: the kubelet's watcher then unregisters the driver.
  if (registrar_) {
    registrar_->Shutdown();
    registrar_.reset();
    ::unlink(options_.registration.c_str());
  }
  if (csi_) {
    csi_->Shutdown();
    csi_.reset();
    ::unlink(options_.endpoint.c_str());
  }
}

bool CsiPlugin::registered() const { return services_ != nullptr && services_->registered(); }
std::string CsiPlugin::registration_error() const {
  return services_ == nullptr ? std::string() : services_->error();
}

}  // namespace weightcache::kube
