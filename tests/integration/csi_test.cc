// "Identity given, not guessed": an engine pod is the socket it connects on. A real
// weightcached serves the CSI node plugin; this test plays the kubelet (there is none here):
// it makes each pod's directory as the kubelet does (<pods>/<uid>/volumes/kubernetes.io~csi/
// <volume>/, the target "mount" inside it) and calls NodePublishVolume with the pod info the
// kubelet sends for podInfoOnMount (csi_plugin_test holds the call's fields and order).
// The daemon runs in a pid namespace of its own (unshare --pid): it sees no peer's pid, as
// without hostPID, so a connection on the shared socket names nobody (pid 0).
#include <grpcpp/grpcpp.h>
#include <sys/wait.h>

#include <filesystem>
#include <iostream>
#include <memory>

#include "csi/v1/csi.grpc.pb.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "pkg/kube/csi_plugin.h"
#include "pkg/safetensors/writer.h"
#include "tests/integration/daemon_harness.h"
#include "tests/integration/process.h"
#include "tests/testutil/temp_dir.h"

namespace weightcache {
namespace {

using namespace std::chrono_literals;
using testing::Process;

struct Pod {
  std::string uid, ns, name;
};
const Pod kPodA{"0a1b2c3d-0000-4000-8000-00000000000a", "team-a", "attacker"};
const Pod kPodB{"0a1b2c3d-0000-4000-8000-00000000000b", "team-b", "engine"};

// A process whose children each connect() a socket the parent made and exit at once (the
// finding): `per` connections per socket, held by the parent until its stdin closes.
const char kForkingConnects[] =
    "import os, socket, sys\n"
    "held = []\n"
    "per = int(sys.argv[1])\n"
    "for path in sys.argv[2:]:\n"
    "  for i in range(per // 6):\n"
    "    made = [socket.socket(socket.AF_UNIX) for _ in range(6)]\n"
    "    pid = os.fork()\n"
    "    if pid == 0:\n"
    "      for c in made:\n"
    "        try: c.connect(path)\n"
    "        except OSError: pass\n"
    "      os._exit(0)\n"
    "    os.waitpid(pid, 0)\n"
    "    held += made\n"
    "print('HELD', len(held), flush=True)\n"
    "sys.stdin.read()\n";

class CsiTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (std::system("unshare --pid --fork --kill-child --mount-proc true 2>/dev/null") != 0) {
      GTEST_SKIP() << "unshare --pid is not allowed here: the daemon cannot be run without "
                      "seeing its peers' pids";
    }
    std::filesystem::create_directories(dir_ / "models");
    std::filesystem::create_directories(dir_ / "pods");
    ASSERT_TRUE(safetensors::WriteLlamaCheckpoint(dir_ / "models/m", testing::SmallLlama()).ok());
  }
  void Start() {
    std::vector<std::string> argv{"/usr/bin/unshare",
                                  "--pid",
                                  "--fork",
                                  "--kill-child",
                                  "--mount-proc",
                                  WEIGHTCACHED_PATH,
                                  "--socket_dir=" + socket_dir(),
                                  "--backend=host",
                                  "--metrics_address=off",
                                  "--model=name=m,model_dir=" + dir_ / "models/m",
                                  "--csi_endpoint=" + csi(),
                                  "--csi_registration_dir=none",
                                  "--csi_pods_dir=" + dir_ / "pods",
                                  "--max_connections=64",
                                  "--max_connections_per_pod=32"};
    auto d = testing::StartDaemon(argv, socket_dir(), dir_ / "daemon.log");
    ASSERT_TRUE(d.ok()) << d.status();
    daemon_ = std::move(d->process);
    for (int i = 0; i < 2000 && !std::filesystem::exists(csi()); ++i) {
      std::this_thread::sleep_for(5ms);  // the plugin serves just after the daemon
    }
    node_ = csi::v1::Node::NewStub(
        grpc::CreateChannel("unix:" + csi(), grpc::InsecureChannelCredentials()));
  }
  // unshare --fork ignores SIGTERM while it waits: the daemon (its child) is told.
  void Stop() {
    const pid_t pid = daemon_->pid();
    std::string children = testing::ReadFileOrEmpty("/proc/" + std::to_string(pid) + "/task/" +
                                                    std::to_string(pid) + "/children");
    const pid_t child = static_cast<pid_t>(std::atol(children.c_str()));
    ASSERT_GT(child, 0) << "unshare's child";
    ::kill(child, SIGTERM);
    daemon_->Wait();
    daemon_.reset();
  }
  std::string socket_dir() const { return dir_ / "s"; }
  std::string csi() const { return dir_ / "csi/csi.sock"; }
  // The pod's volume directory, as the kubelet names it (longer than a socket path may be).
  std::string Volume(const Pod& p) const {
    return dir_ / ("pods/" + p.uid + "/volumes/kubernetes.io~csi/weightcache/mount");
  }
  // Where the pod's containers see it (a short path, as its mount in the container is): a
  // link to the volume.
  std::string InPod(const Pod& p) {
    const std::string link = dir_ / p.name.substr(0, 1);
    if (!std::filesystem::exists(link)) std::filesystem::create_directory_symlink(Volume(p), link);
    return link;
  }
  grpc::Status Publish(const Pod& p) {
    std::filesystem::create_directories(std::filesystem::path(Volume(p)).parent_path());
    csi::v1::NodePublishVolumeRequest req;
    req.set_volume_id("csi-" + p.uid);
    req.set_target_path(Volume(p));
    req.mutable_volume_capability()->mutable_mount();
    auto& ctx = *req.mutable_volume_context();
    ctx[kube::kCsiPodName] = p.name;
    ctx[kube::kCsiPodNamespace] = p.ns;
    ctx[kube::kCsiPodUid] = p.uid;
    ctx[kube::kCsiServiceAccount] = "default";
    ctx[kube::kCsiEphemeral] = "true";
    csi::v1::NodePublishVolumeResponse resp;
    grpc::ClientContext cc;
    return node_->NodePublishVolume(&cc, req, &resp);
  }
  grpc::Status Unpublish(const Pod& p) {
    csi::v1::NodeUnpublishVolumeRequest req;
    req.set_volume_id("csi-" + p.uid);
    req.set_target_path(Volume(p));
    csi::v1::NodeUnpublishVolumeResponse resp;
    grpc::ClientContext cc;
    return node_->NodeUnpublishVolume(&cc, req, &resp);
  }
  // An engine that acquires model m through `dir`'s control socket: served or not.
  bool Served(const std::string& dir, const std::string& name) {
    Process p({TEST_CLIENT_PATH, dir, "m"}, dir_ / (name + ".err"));
    bool ready = false;
    std::string said;
    while (auto line = p.ReadLine(60s)) {
      said += *line + "\n";
      if ((ready = line->rfind("READY", 0) == 0)) break;
    }
    p.Kill(SIGKILL);
    p.Wait();
    if (!ready) {
      std::cerr << name << ": " << said << testing::ReadFileOrEmpty(dir_ / (name + ".err"));
    }
    return ready;
  }
  std::unique_ptr<Process> Attack(int per, const std::vector<std::string>& sockets,
                                  const std::string& name) {
    std::vector<std::string> argv{"/usr/bin/python3", "-c", kForkingConnects, std::to_string(per)};
    argv.insert(argv.end(), sockets.begin(), sockets.end());
    return std::make_unique<Process>(argv, dir_ / (name + ".err"));
  }

  testing::TempDir dir_;
  std::unique_ptr<Process> daemon_;
  std::unique_ptr<csi::v1::Node::Stub> node_;
};

// Finding 1 without hostPID: on the shared socket every peer is pid 0 and shares the one
// unresolved unit, so a pod whose children connect and exit takes that unit's connections and
// another pod's engine is refused (the guess fails). On the pods' own sockets the kubelet
// named each pod: the attacker fills only its own pod's cap, and the other pod is served 5/5
// with its leases, caps and Status under its own name.
TEST_F(CsiTest, CsiAPodIsTheSocketItConnectsOnAForkingPodCannotStarveAnother) {
  Start();
  for (const Pod* p : {&kPodA, &kPodB}) {
    const grpc::Status s = Publish(*p);
    ASSERT_TRUE(s.ok()) << s.error_code() << " " << s.error_message()
                        << testing::ReadFileOrEmpty(dir_ / "daemon.log");
  }
  EXPECT_TRUE(std::filesystem::exists(Volume(kPodA) + "/control.sock"));
  EXPECT_TRUE(std::filesystem::exists(Volume(kPodB) + "/handle.sock"));

  // The guess: on the shared socket pod B is refused beside the attacker (no pid is visible).
  auto shared = Attack(24, {socket_dir() + "/control.sock"}, "attack-shared");
  ASSERT_THAT(shared->WaitFor("HELD", 60s).value_or(""), ::testing::StartsWith("HELD"));
  EXPECT_FALSE(Served(socket_dir(), "shared-b")) << "the shared socket told the pods apart";
  shared->CloseStdin();
  shared->Wait();

  // Given: pod A floods its own sockets past the node's totals; pod B is served on its own.
  auto own =
      Attack(72, {InPod(kPodA) + "/control.sock", InPod(kPodA) + "/handle.sock"}, "attack-own");
  ASSERT_THAT(own->WaitFor("HELD", 60s).value_or(""), ::testing::StartsWith("HELD"));
  int served = 0;
  for (int i = 0; i < 5; ++i) served += Served(InPod(kPodB), "own-b") ? 1 : 0;
  EXPECT_EQ(served, 5) << testing::ReadFileOrEmpty(dir_ / "own-b.err")
                       << testing::ReadFileOrEmpty(dir_ / "daemon.log");

  // Its lease is pod B's, by the name the kubelet gave.
  Process holder({TEST_CLIENT_PATH, InPod(kPodB), "m"}, dir_ / "holder.err");
  ASSERT_TRUE(holder.WaitFor("READY", 60s).has_value());
  auto admin = testing::AdminClient(socket_dir());
  ASSERT_NE(admin, nullptr);
  auto st = admin->Status();
  ASSERT_TRUE(st.ok()) << st.status();
  ASSERT_EQ(st->entries_size(), 1);
  bool found = false;
  for (const auto& l : st->entries(0).leases()) {
    found |= l.owner() == "pod:" + kPodB.uid && l.owner_pod() == "team-b/engine";
  }
  EXPECT_TRUE(found) << st->DebugString();
  own->CloseStdin();
  own->Wait();
}

// The kubelet publishes a running pod's volume once: a daemon that restarts serves the pod's
// sockets again from its record; unpublishing removes them and the directory.
TEST_F(CsiTest, CsiPodSocketsOutliveADaemonRestartAndGoWithTheVolume) {
  Start();
  ASSERT_TRUE(Publish(kPodB).ok());
  ASSERT_TRUE(Publish(kPodB).ok()) << "the kubelet retries: publishing again is no error";
  ASSERT_TRUE(Served(InPod(kPodB), "before"));
  Stop();
  Start();
  EXPECT_TRUE(Served(InPod(kPodB), "after")) << testing::ReadFileOrEmpty(dir_ / "daemon.log");
  // A second volume for the same pod is refused, naming the first.
  const grpc::Status again = [&] {
    csi::v1::NodePublishVolumeRequest req;
    req.set_volume_id("csi-other");
    req.set_target_path(Volume(kPodB) + "2");
    auto& ctx = *req.mutable_volume_context();
    ctx[kube::kCsiPodName] = kPodB.name;
    ctx[kube::kCsiPodNamespace] = kPodB.ns;
    ctx[kube::kCsiPodUid] = kPodB.uid;
    ctx[kube::kCsiEphemeral] = "true";
    csi::v1::NodePublishVolumeResponse resp;
    grpc::ClientContext cc;
    return node_->NodePublishVolume(&cc, req, &resp);
  }();
  EXPECT_EQ(again.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(again.error_message(), ::testing::HasSubstr("csi-" + kPodB.uid));
  ASSERT_TRUE(Unpublish(kPodB).ok());
  EXPECT_FALSE(std::filesystem::exists(Volume(kPodB)));
  EXPECT_TRUE(Unpublish(kPodB).ok()) << "an unknown volume: no error";
}

}  // namespace
}  // namespace weightcache
