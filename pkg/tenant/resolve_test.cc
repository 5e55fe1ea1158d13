// The resolver on a fixture /proc tree (every layout of cgroup_test is a file there), on this
// process's real /proc entry, and on a child process moved into a real pod-shaped cgroup
// where the machine lets the test make one.
#include "pkg/tenant/resolve.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "tests/testutil/pod_cgroup.h"
#include "tests/testutil/temp_dir.h"

namespace weightcache::tenant {
namespace {

constexpr char kUid[] = "0f4c3d1e-7b2a-4c55-9f1e-2b8d6c9a1e33";
constexpr char kCid[] = "6f0c3e7a9b1d2c4e5f6a7b8c9d0e1f2a3b4c5d6e7f8091a2b3c4d5e6f7a8b9c0";

void WriteProc(const testing::TempDir& root, int pid, const std::string& cgroup,
               const std::string& stat) {
  const std::string dir = root / std::to_string(pid);
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/cgroup") << cgroup;
  std::ofstream(dir + "/stat") << stat;
}

// A stat line whose command holds spaces and parentheses; starttime (field 22) = `start`.
std::string Stat(int pid, uint64_t start) {
  return std::to_string(pid) + " (a (b) c) S 1 1 1 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 1 0 " +
         std::to_string(start) + " 1000 10 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 3 0\n";
}

TEST(ResolveTest, StartTimeIsCountedAfterTheCommandName) {
  EXPECT_EQ(StartTicksOfStat(Stat(7, 123456)), 123456u);
  EXPECT_EQ(StartTicksOfStat("7 (x) S 1"), 0u);
  EXPECT_EQ(StartTicksOfStat(""), 0u);
}

TEST(ResolveTest, PodProcessAndUnknownFromAFixtureProc) {
  testing::TempDir root;
  WriteProc(root, 10,
            std::string("0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod") +
                "0f4c3d1e_7b2a_4c55_9f1e_2b8d6c9a1e33.slice/cri-containerd-" + kCid + ".scope\n",
            Stat(10, 500));
  WriteProc(root, 11, "0::/user.slice/user-0.slice/session-1.scope\n", Stat(11, 600));
  Resolver r(root.path());
  const Unit pod = r.Resolve(10);
  EXPECT_EQ(pod.kind, UnitKind::kPod);
  EXPECT_EQ(pod.Key(), std::string("pod:") + kUid);
  EXPECT_EQ(pod.container, kCid);
  const Unit proc = r.Resolve(11);
  EXPECT_EQ(proc.kind, UnitKind::kProcess);
  EXPECT_EQ(proc.Key(), "process:11/600");
  // The same pid started again is another unit.
  WriteProc(root, 11, "0::/\n", Stat(11, 601));
  EXPECT_NE(r.Resolve(11).Key(), proc.Key());
  // Not visible (SO_PEERCRED's 0) or gone before it was read.
  EXPECT_EQ(r.Resolve(0).kind, UnitKind::kUnknown);
  EXPECT_EQ(r.Resolve(12).kind, UnitKind::kUnknown);
  const Resolver::Counts n = r.counts();
  EXPECT_EQ(n.pods, 1u);
  EXPECT_EQ(n.processes, 2u);
  EXPECT_EQ(n.unknown, 2u);
}

TEST(ResolveTest, ThisProcessIsAProcessUnit) {
  Resolver r;
  const Unit me = r.Resolve(::getpid());
  // This test may itself run in a pod (a CI runner on Kubernetes): then it is that pod.
  ASSERT_NE(me.kind, UnitKind::kUnknown);
  if (me.kind == UnitKind::kProcess) EXPECT_GT(me.start_ticks, 0u);
  EXPECT_EQ(r.Resolve(::getpid()).Key(), me.Key());
}

TEST(ResolveTest, AChildInARealPodCgroupIsThatPod) {
  std::string why;
  auto cg = testing::PodCgroup::Make(kUid, kCid, &why);
  if (cg == nullptr) GTEST_SKIP() << "cannot make a pod cgroup here: " << why;
  int go[2];
  ASSERT_EQ(::pipe(go), 0);
  const pid_t child = ::fork();
  if (child == 0) {
    ::close(go[1]);
    char b;
    (void)!::read(go[0], &b, 1);  // until the parent closes the pipe
    ::_exit(0);
  }
  ::close(go[0]);
  ASSERT_TRUE(cg->Add(child)) << cg->path();
  const Unit u = Resolver().Resolve(child);
  ::close(go[1]);
  ::waitpid(child, nullptr, 0);
  EXPECT_EQ(u.kind, UnitKind::kPod) << cg->path();
  EXPECT_EQ(u.pod, kUid);
  EXPECT_EQ(u.container, kCid);
}

}  // namespace
}  // namespace weightcache::tenant
