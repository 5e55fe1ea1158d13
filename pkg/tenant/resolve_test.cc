// The resolver on a fixture /proc tree (every layout of cgroup_test is a file there), on this
// process's real /proc entry, and on a child process moved into a real pod-shaped cgroup
// where the machine lets the test make one.
#include "pkg/tenant/resolve.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "pkg/util/scoped_fd.h"
#include "pkg/util/unix_socket.h"
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

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
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
  // Every unresolved peer is the one shared unit, whatever its pid.
  EXPECT_EQ(r.Resolve(12).Key(), kUnresolvedKey);
  EXPECT_EQ(r.Resolve(0).Key(), r.Resolve(13).Key());
  // A zombie is gone as far as its pid can tell.
  WriteProc(root, 14, "0::/\n", "14 (z) Z 1 1 1 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 1 0 700 0 0 0\n");
  EXPECT_EQ(StateOfStat(ReadAll(root / "14/stat")), 'Z');
  EXPECT_EQ(r.Resolve(14).Key(), kUnresolvedKey);
  const Resolver::Counts n = r.counts();
  EXPECT_EQ(n.pods, 1u);
  EXPECT_EQ(n.processes, 2u);
  EXPECT_EQ(n.unknown, 6u);
}

// A child that connects a socket its parent made and exits at once (finding 1 of "Identity
// given, not guessed"): its pid names nobody (reaped) or a zombie by the time the daemon
// reads it. Each such connection was a unit of its own ("unknown:<pid>", or a process unit
// for a zombie), so a pod forking children passed every per-unit cap; now all of them are
// the one unresolved unit. The connection is given, so SO_PEERPIDFD pins the peer where the
// kernel has it; a live peer is still its process.
TEST(ResolveTest, PeersThatExitedAtOnceAreOneUnresolvedUnit) {
  testing::TempDir dir;
  const std::string path = dir / "s.sock";
  ScopedFd listener(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof addr.sun_path, "%s", path.c_str());
  ASSERT_EQ(::bind(listener.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(::listen(listener.get(), 8), 0);
  Resolver r;
  std::set<std::string> keys;
  for (bool reap : {true, false, true, false}) {
    ScopedFd made(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));  // the parent's
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      // The connection's credentials are the connecting child's; it exits at once.
      ::_exit(::connect(made.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 ? 0 : 1);
    }
    siginfo_t info{};
    // Exited: reaped, or left a zombie (WNOWAIT).
    ASSERT_EQ(::waitid(P_PID, child, &info, WEXITED | (reap ? 0 : WNOWAIT)), 0);
    ASSERT_EQ(info.si_status, 0);
    ScopedFd conn(::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
    ASSERT_TRUE(conn.valid());
    auto cred = GetPeerCred(conn.get());
    ASSERT_TRUE(cred.ok()) << cred.status();
    ASSERT_EQ(cred->pid, child);
    const Unit u = r.Resolve(cred->pid, conn.get());
    EXPECT_EQ(u.kind, UnitKind::kUnknown) << (reap ? "reaped " : "zombie ") << u.Key();
    keys.insert(u.Key());
    if (!reap) ::waitpid(child, nullptr, 0);
  }
  EXPECT_EQ(keys, std::set<std::string>{kUnresolvedKey});
}

// The peer's connection given: alive, it is its process (or pod) unit, as by pid alone.
TEST(ResolveTest, ALivePeerPinnedByItsConnectionIsItsProcess) {
  Resolver r;
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  ScopedFd a(sv[0]), b(sv[1]);
  const Unit me = r.Resolve(::getpid(), a.get());  // a socketpair's peer: its maker, here
  EXPECT_NE(me.kind, UnitKind::kUnknown);
  EXPECT_EQ(me.Key(), r.Resolve(::getpid()).Key());
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
