// Pod volumes on a real control listener and handle channel (no gRPC behind: the control
// connections are closed as they come): the record a restart reads, and what it does with a
// record it cannot read or a volume whose pod is gone.
#include "pkg/server/wire/pod_volumes.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include "gtest/gtest.h"
#include "pkg/util/unix_socket.h"
#include "tests/testutil/temp_dir.h"

namespace weightcache::server {
namespace {

constexpr char kUid[] = "0a1b2c3d-0000-4000-8000-00000000000b";

class PodVolumesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ControlListener::Options co;
    co.path = dir_ / "control.sock";
    auto control = ControlListener::Start(co, [](int fd) { ::close(fd); });
    ASSERT_TRUE(control.ok()) << control.status();
    control_ = std::move(control).value();
    HandleChannel::Options ho;
    ho.path = dir_ / "handle.sock";
    auto handles = HandleChannel::Start(
        ho,
        [](const std::string&, const PeerCred&, const std::string&)
            -> absl::StatusOr<HandleChannel::Grant> { return absl::NotFoundError("no token"); },
        [](const std::string&) {}, [] {});
    ASSERT_TRUE(handles.ok()) << handles.status();
    handles_ = std::move(handles).value();
    std::filesystem::create_directories(std::filesystem::path(Target()).parent_path());
  }
  std::string Target() const {
    return dir_ / ("pods/" + std::string(kUid) + "/volumes/kubernetes.io~csi/weightcache/mount");
  }
  std::string Record() const { return dir_ / "state/pod-volumes.json"; }
  kube::PodVolume Volume() const {
    return {.volume_id = "csi-b",
            .target_path = Target(),
            .pod_namespace = "team-b",
            .pod_name = "engine",
            .pod_uid = kUid,
            .service_account = "default"};
  }
  std::unique_ptr<PodVolumes> Make() {
    return std::make_unique<PodVolumes>(Record(), control_.get(), handles_.get());
  }

  testing::TempDir dir_;
  std::unique_ptr<ControlListener> control_;
  std::unique_ptr<HandleChannel> handles_;
};

TEST_F(PodVolumesTest, APublishedVolumeIsRecordedAndServedAgainByTheNextDaemon) {
  {
    auto v = Make();
    ASSERT_TRUE(v->Publish(Volume()).ok());
    EXPECT_TRUE(ConnectUnix(Target() + "/control.sock").ok());
    EXPECT_TRUE(ConnectUnix(Target() + "/handle.sock").ok());
  }
  // What a daemon killed leaves: the socket files, nobody listening on them.
  control_->RemovePodSocket(kUid);
  handles_->RemovePodSocket(kUid);
  for (const char* name : {"/control.sock", "/handle.sock"}) {
    auto stale = ListenUnix(Target() + name, 0666);
    ASSERT_TRUE(stale.ok()) << stale.status();  // closed at once: a stale socket file
  }
  EXPECT_FALSE(ConnectUnix(Target() + "/control.sock").ok());
  auto again = Make();
  ASSERT_TRUE(again->Restore().ok());
  EXPECT_EQ(again->size(), 1u);
  EXPECT_TRUE(ConnectUnix(Target() + "/control.sock").ok());
  EXPECT_TRUE(ConnectUnix(Target() + "/handle.sock").ok());
}

// The pod ended while no daemon ran (the kubelet removed its directory): forgotten.
TEST_F(PodVolumesTest, AVolumeWhosePodIsGoneIsForgottenAtRestore) {
  ASSERT_TRUE(Make()->Publish(Volume()).ok());
  std::filesystem::remove_all(dir_ / "pods");
  auto again = Make();
  ASSERT_TRUE(again->Restore().ok());
  EXPECT_EQ(again->size(), 0u);
  std::ifstream in(Record());
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text.find(kUid), std::string::npos) << text;
}

// A record that is not one stops the start, naming the file and what to do, and is left as it
// is (nothing lost: an operator may look at it).
TEST_F(PodVolumesTest, ARecordThatCannotBeReadIsNamedAndLeftAsItIs) {
  std::filesystem::create_directories(dir_ / "state");
  {
    std::ofstream out(Record());
    out << "{\"version\": 7, \"volumes\": [";
  }
  const absl::Status s = Make()->Restore();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(s.message().find(Record()), std::string_view::npos) << s.message();
  EXPECT_NE(s.message().find("move it away"), std::string_view::npos) << s.message();
  std::ifstream in(Record());
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text, "{\"version\": 7, \"volumes\": [");
}

// Once the daemon stops, the kubelet's calls are answered UNAVAILABLE (it retries), and no
// socket is made on listeners about to close.
TEST_F(PodVolumesTest, AfterStopTheCallsAreUnavailableAndNothingIsServed) {
  auto v = Make();
  v->Stop();
  EXPECT_EQ(v->Publish(Volume()).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(v->Unpublish("csi-b", Target()).code(), absl::StatusCode::kUnavailable);
  EXPECT_FALSE(std::filesystem::exists(Target() + "/control.sock"));
}

}  // namespace
}  // namespace weightcache::server
