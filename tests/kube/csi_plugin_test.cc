// The CSI node plugin against a test kubelet: this test plays the kubelet's side of plugin
// registration (the plugin watcher's GetInfo, then NotifyRegistrationStatus) and of an inline
// ephemeral volume's life (NodeGetInfo, NodeGetCapabilities, NodePublishVolume with the pod
// info the kubelet sets for podInfoOnMount, NodeUnpublishVolume), with the field values the
// kubelet sends. There is no kubelet here: the calls, their order and their fields are the
// test's, written from the CSI spec and the kubelet's csi volume plugin.
#include "pkg/kube/csi_plugin.h"

#include <grpcpp/grpcpp.h>

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "csi/v1/csi.grpc.pb.h"
#include "gtest/gtest.h"
#include "pkg/util/mutex.h"
#include "pluginregistration/v1/api.grpc.pb.h"
#include "tests/testutil/temp_dir.h"

namespace weightcache::kube {
namespace {

constexpr char kUid[] = "0c8f7a3e-5b2d-4e61-9f00-1a2b3c4d5e6f";

class CsiPluginTest : public ::testing::Test {
 protected:
  void Start() {
    CsiPlugin::Options o;
    o.node_id = "node-1";
    o.endpoint = dir_ / "plugins/csi.weightcache.io/csi.sock";
    o.registration = dir_ / "plugins_registry/csi.weightcache.io-reg.sock";
    o.kubelet_endpoint = "/var/lib/kubelet/plugins/csi.weightcache.io/csi.sock";
    o.pods_dir = dir_ / "pods";
    auto p = CsiPlugin::Start(
        o,
        [this](const PodVolume& v) {
          MutexLock l(mu_);
          published_.push_back(v);
          return absl::OkStatus();
        },
        [this](const std::string& id, const std::string& target) {
          MutexLock l(mu_);
          unpublished_.push_back(id + " " + target);
          return absl::OkStatus();
        });
    ASSERT_TRUE(p.ok()) << p.status();
    plugin_ = std::move(p).value();
    node_ = csi::v1::Node::NewStub(
        grpc::CreateChannel("unix:" + o.endpoint, grpc::InsecureChannelCredentials()));
    identity_ = csi::v1::Identity::NewStub(
        grpc::CreateChannel("unix:" + o.endpoint, grpc::InsecureChannelCredentials()));
    registrar_ = pluginregistration::Registration::NewStub(
        grpc::CreateChannel("unix:" + o.registration, grpc::InsecureChannelCredentials()));
  }
  std::string Target(const std::string& uid) const {
    return dir_ / ("pods/" + uid + "/volumes/kubernetes.io~csi/weightcache/mount");
  }
  // NodePublishVolume as the kubelet sends it for an inline volume with podInfoOnMount.
  grpc::Status Publish(const std::string& target, std::map<std::string, std::string> context) {
    csi::v1::NodePublishVolumeRequest req;
    req.set_volume_id("csi-5f1c0e9d2a7b4c3e8f6a1b2c3d4e5f60");
    req.set_target_path(target);
    req.mutable_volume_capability()->mutable_mount();
    req.mutable_volume_capability()->mutable_access_mode()->set_mode(
        csi::v1::VolumeCapability::AccessMode::SINGLE_NODE_WRITER);
    for (auto& [k, v] : context) (*req.mutable_volume_context())[k] = v;
    csi::v1::NodePublishVolumeResponse resp;
    grpc::ClientContext ctx;
    return node_->NodePublishVolume(&ctx, req, &resp);
  }
  static std::map<std::string, std::string> PodInfo() {
    return {{kCsiPodName, "engine-0"},
            {kCsiPodNamespace, "team-a"},
            {kCsiPodUid, kUid},
            {kCsiServiceAccount, "engine"},
            {kCsiEphemeral, "true"}};
  }

  testing::TempDir dir_;
  std::unique_ptr<CsiPlugin> plugin_;
  std::unique_ptr<csi::v1::Node::Stub> node_;
  std::unique_ptr<csi::v1::Identity::Stub> identity_;
  std::unique_ptr<pluginregistration::Registration::Stub> registrar_;
  Mutex mu_;
  std::vector<PodVolume> published_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> unpublished_ ABSL_GUARDED_BY(mu_);
};

// The plugin watcher's two calls, then the volume's life in the kubelet's order; the pod is
// the one the kubelet named.
TEST_F(CsiPluginTest, CsiKubeletRegistersThePluginAndPublishesAPodsVolume) {
  Start();
  {
    grpc::ClientContext ctx;
    pluginregistration::PluginInfo info;
    ASSERT_TRUE(registrar_->GetInfo(&ctx, {}, &info).ok());
    EXPECT_EQ(info.type(), "CSIPlugin");
    EXPECT_EQ(info.name(), "csi.weightcache.io");
    EXPECT_EQ(info.endpoint(), "/var/lib/kubelet/plugins/csi.weightcache.io/csi.sock");
    ASSERT_EQ(info.supported_versions_size(), 1);
    EXPECT_EQ(info.supported_versions(0), "1.0.0");
  }
  EXPECT_FALSE(plugin_->registered());
  {
    grpc::ClientContext ctx;
    pluginregistration::RegistrationStatus st;
    st.set_plugin_registered(true);
    pluginregistration::RegistrationStatusResponse r;
    ASSERT_TRUE(registrar_->NotifyRegistrationStatus(&ctx, st, &r).ok());
  }
  EXPECT_TRUE(plugin_->registered());
  {
    grpc::ClientContext ctx;
    csi::v1::GetPluginInfoResponse r;
    ASSERT_TRUE(identity_->GetPluginInfo(&ctx, {}, &r).ok());
    EXPECT_EQ(r.name(), "csi.weightcache.io");
  }
  {
    grpc::ClientContext ctx;
    csi::v1::NodeGetInfoResponse r;
    ASSERT_TRUE(node_->NodeGetInfo(&ctx, {}, &r).ok());
    EXPECT_EQ(r.node_id(), "node-1");
  }
  {
    grpc::ClientContext ctx;
    csi::v1::NodeGetCapabilitiesResponse r;
    ASSERT_TRUE(node_->NodeGetCapabilities(&ctx, {}, &r).ok());
    EXPECT_EQ(r.capabilities_size(), 0) << "no staging: the kubelet publishes directly";
  }
  const grpc::Status s = Publish(Target(kUid), PodInfo());
  ASSERT_TRUE(s.ok()) << s.error_message();
  {
    MutexLock l(mu_);
    ASSERT_EQ(published_.size(), 1u);
    EXPECT_EQ(published_[0].pod_uid, kUid);
    EXPECT_EQ(published_[0].pod_namespace, "team-a");
    EXPECT_EQ(published_[0].pod_name, "engine-0");
    EXPECT_EQ(published_[0].service_account, "engine");
    EXPECT_EQ(published_[0].target_path, Target(kUid));
  }
  csi::v1::NodeUnpublishVolumeRequest un;
  un.set_volume_id("csi-5f1c0e9d2a7b4c3e8f6a1b2c3d4e5f60");
  un.set_target_path(Target(kUid));
  csi::v1::NodeUnpublishVolumeResponse ur;
  grpc::ClientContext ctx;
  ASSERT_TRUE(node_->NodeUnpublishVolume(&ctx, un, &ur).ok());
  MutexLock l(mu_);
  ASSERT_EQ(unpublished_.size(), 1u);
  EXPECT_EQ(unpublished_[0], "csi-5f1c0e9d2a7b4c3e8f6a1b2c3d4e5f60 " + Target(kUid));
}

// A volume without the pod's identity (a CSIDriver without podInfoOnMount), one that is not
// inline, and a target outside the kubelet's pods directory are refused by name, and nothing
// is published.
TEST_F(CsiPluginTest, CsiRefusesAVolumeThatNamesNoPodOrLiesOutsideThePodsDir) {
  Start();
  auto no_uid = PodInfo();
  no_uid.erase(kCsiPodUid);
  grpc::Status s = Publish(Target(kUid), no_uid);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("csi.storage.k8s.io/pod.uid"), std::string::npos)
      << s.error_message();
  EXPECT_NE(s.error_message().find("podInfoOnMount"), std::string::npos);

  auto persistent = PodInfo();
  persistent.erase(kCsiEphemeral);
  s = Publish(Target(kUid), persistent);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("not an inline ephemeral volume"), std::string::npos);

  for (const std::string& target :
       {std::string("/etc/weightcache"), Target(kUid) + "/../../x", std::string(dir_ / "pods")}) {
    s = Publish(target, PodInfo());
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << target;
    EXPECT_NE(s.error_message().find("is not a path under"), std::string::npos) << target;
  }
  auto bad_uid = PodInfo();
  bad_uid[kCsiPodUid] = "../../etc";
  s = Publish(Target(kUid), bad_uid);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  MutexLock l(mu_);
  EXPECT_TRUE(published_.empty());
}

// Stopping removes both sockets, so the kubelet's watcher unregisters the driver.
TEST_F(CsiPluginTest, CsiStopRemovesTheEndpointAndTheRegistrationSocket) {
  Start();
  const std::string endpoint = plugin_->options().endpoint;
  const std::string registration = plugin_->options().registration;
  EXPECT_TRUE(std::filesystem::exists(endpoint));
  EXPECT_TRUE(std::filesystem::exists(registration));
  plugin_->Stop();
  EXPECT_FALSE(std::filesystem::exists(endpoint));
  EXPECT_FALSE(std::filesystem::exists(registration));
}

}  // namespace
}  // namespace weightcache::kube
