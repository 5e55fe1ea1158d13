// The pod parser on /proc/PID/cgroup contents in the formats real nodes write: cgroup v1,
// v2 and hybrid; the cgroupfs and systemd drivers; containerd, CRI-O and cri-dockerd; the
// three QoS classes; static pods; kind's --cgroup-root; paths seen from inside a cgroup
// namespace. Each fixture is what `cat /proc/PID/cgroup` prints for a container process.
#include "pkg/tenant/cgroup.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace weightcache::tenant {
namespace {

using ::testing::HasSubstr;

constexpr char kUid[] = "0f4c3d1e-7b2a-4c55-9f1e-2b8d6c9a1e33";
constexpr char kCid[] = "6f0c3e7a9b1d2c4e5f6a7b8c9d0e1f2a3b4c5d6e7f8091a2b3c4d5e6f7a8b9c0";

std::optional<PodRef> Pod(const std::string& content) {
  auto lines = ParseProcCgroup(content);
  EXPECT_TRUE(lines.ok()) << lines.status();
  return lines.ok() ? PodOfLines(*lines) : std::nullopt;
}

struct Layout {
  const char* name;
  std::string content;
  const char* driver;
};

TEST(CgroupTest, EveryKubeletLayoutNamesThePodAndContainer) {
  const std::string u = kUid, c = kCid;
  const std::string su = "0f4c3d1e_7b2a_4c55_9f1e_2b8d6c9a1e33";  // systemd writes '_'
  const std::vector<Layout> layouts = {
      {"v1 cgroupfs containerd burstable",
       "12:pids:/kubepods/burstable/pod" + u + "/" + c + "\n11:memory:/kubepods/burstable/pod" + u +
           "/" + c + "\n3:cpu,cpuacct:/kubepods/burstable/pod" + u + "/" + c +
           "\n1:name=systemd:/kubepods/burstable/pod" + u + "/" + c + "\n0::/\n",
       "cgroupfs"},
      {"v1 cgroupfs guaranteed (no QoS level)",
       "4:memory:/kubepods/pod" + u + "/" + c + "\n2:pids:/kubepods/pod" + u + "/" + c + "\n",
       "cgroupfs"},
      {"v2 cgroupfs CRI-O besteffort", "0::/kubepods/besteffort/pod" + u + "/crio-" + c + "\n",
       "cgroupfs"},
      {"v2 systemd containerd besteffort",
       "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod" + su +
           ".slice/cri-containerd-" + c + ".scope\n",
       "systemd"},
      {"v2 systemd CRI-O guaranteed",
       "0::/kubepods.slice/kubepods-pod" + su + ".slice/crio-" + c + ".scope\n", "systemd"},
      {"v1 systemd CRI-O burstable",
       "11:memory:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + su +
           ".slice/crio-" + c +
           ".scope\n1:name=systemd:/kubepods.slice/"
           "kubepods-burstable.slice/kubepods-burstable-pod" +
           su + ".slice/crio-" + c + ".scope\n",
       "systemd"},
      {"v2 systemd cri-dockerd",
       "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + su +
           ".slice/docker-" + c + ".scope\n",
       "systemd"},
      {"kind: --cgroup-root under kubelet.slice",
       "0::/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/"
       "kubelet-kubepods-besteffort-pod" +
           su + ".slice/cri-containerd-" + c + ".scope\n",
       "systemd"},
      {"v2 systemd, read from inside another container's cgroup namespace",
       "0::/../../kubepods-besteffort-pod" + su + ".slice/cri-containerd-" + c + ".scope\n",
       "systemd"},
      {"v2 cgroupfs, read from inside another container's cgroup namespace",
       "0::/../../pod" + u + "/" + c + "\n", "cgroupfs"},
  };
  for (const Layout& l : layouts) {
    SCOPED_TRACE(l.name);
    auto pod = Pod(l.content);
    ASSERT_TRUE(pod.has_value());
    EXPECT_EQ(pod->uid, kUid);
    EXPECT_EQ(pod->container, kCid);
    EXPECT_EQ(pod->driver, l.driver);
  }
}

TEST(CgroupTest, StaticPodsAndUpperCaseUidsAreNormalised) {
  // A static pod's UID is the kubelet's 32-hex hash of its manifest.
  auto st =
      Pod("0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-"
          "pod5d5a7b4c3e2f1a0b9c8d7e6f5a4b3c2d.slice/cri-containerd-" +
          std::string(kCid) + ".scope\n");
  ASSERT_TRUE(st.has_value());
  EXPECT_EQ(st->uid, "5d5a7b4c3e2f1a0b9c8d7e6f5a4b3c2d");
  auto upper = Pod("0::/kubepods/besteffort/pod0F4C3D1E-7B2A-4C55-9F1E-2B8D6C9A1E33/x\n");
  ASSERT_TRUE(upper.has_value());
  EXPECT_EQ(upper->uid, kUid);
  EXPECT_EQ(upper->container, "");  // "x" is no container id
}

TEST(CgroupTest, ProcessesOutsidePodsNameNone) {
  for (const std::string content : {
           "0::/\n",
           "0::/user.slice/user-1000.slice/session-3.scope\n",
           "0::/system.slice/containerd.service\n",
           "0::/system.slice/kubelet.service\n",
           "12:pids:/\n11:memory:/process_api/369a66ebf5871c359de7fd6d6e85e891\n0::/\n",
           // Lookalikes: a "pod<UID>" that no kubepods level holds, a malformed UID, a
           // slice that is not the kubelet's.
           "0::/mine/pod0f4c3d1e-7b2a-4c55-9f1e-2b8d6c9a1e33/x\n",
           "0::/kubepods/besteffort/podnot-a-uid/x\n",
           "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod0f4c3d1e-7b2a-"
           "4c55-9f1e-2b8d6c9a1e33.slice/x.scope\n",  // systemd never writes '-' in the UID
           "0::/machine.slice/my-pod0f4c3d1e_7b2a_4c55_9f1e_2b8d6c9a1e33.slice\n",
       }) {
    SCOPED_TRACE(content);
    EXPECT_FALSE(Pod(content).has_value());
  }
}

TEST(CgroupTest, LinesThatNameTwoPodsNameNone) {
  // A hybrid host where one hierarchy says another pod: trust neither.
  const std::string other = "11111111-2222-4333-8444-555555555555";
  EXPECT_FALSE(Pod("12:pids:/kubepods/besteffort/pod" + other + "/x\n0::/kubepods/besteffort/pod" +
                   kUid + "/x\n")
                   .has_value());
  // Lines that name no pod do not disagree.
  auto pod = Pod(std::string("12:pids:/\n0::/kubepods/besteffort/pod") + kUid + "/" + kCid + "\n");
  ASSERT_TRUE(pod.has_value());
  EXPECT_EQ(pod->uid, kUid);
}

TEST(CgroupTest, AMalformedLineIsNamed) {
  auto lines = ParseProcCgroup("0::/\nnot a cgroup line\n");
  ASSERT_FALSE(lines.ok());
  EXPECT_THAT(std::string(lines.status().message()), HasSubstr("'not a cgroup line'"));
  // A path may itself hold ':'.
  auto colon = ParseProcCgroup("0::/a:b\n");
  ASSERT_TRUE(colon.ok());
  EXPECT_EQ((*colon)[0].path, "/a:b");
}

}  // namespace
}  // namespace weightcache::tenant
