// Paths (issue 47, item 4): the keeper and the daemon, as real processes, change nothing at the
// paths they are given that they did not create. A directory they find is used as it is when
// it is safe (never chmod'ed or chown'ed); only a stale socket (nobody listens) is unlinked;
// anything else at a socket's path makes them refuse to start, naming the path and what is
// there. Attacks and answers:
//   keeper turns a shared 1777 directory 0700     TheKeeperLeavesAShared1777DirectoryAsItWas
//   keeper deletes a file or FIFO at --socket     TheKeeperRefusesAFileOrAFifoAtItsSocket...
//   a second keeper unlinks a live one's socket   ASecondKeeperLeavesTheLiveOnesSocket
//   daemon makes an existing socket dir 0750      TheDaemonLeavesAnExistingSocketDirsMode...
//   daemon deletes a file where its socket goes   TheDaemonRefusesAFileWhereItsSocketBelongs
//   a world-writable admin dir                    TheDaemonRefusesAWorldWritableAdminDir
//   restarts after a crash (stale sockets)        AStaleSocketIsReplacedOnRestart; and
//                                                 tests/integration/keeper_test.cc (restarts)
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "pkg/keeper/client.h"
#include "pkg/safetensors/writer.h"
#include "pkg/util/unix_socket.h"
#include "tests/integration/daemon_harness.h"
#include "tests/integration/process.h"
#include "tests/testutil/temp_dir.h"

namespace weightcache {
namespace {

using namespace std::chrono_literals;
using ::testing::HasSubstr;
using testing::Process;
using testing::TempDir;

struct stat Lstat(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(::lstat(path.c_str(), &st), 0) << path;
  return st;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Whether `pid` (our child, not reaped yet) has exited.
bool Exited(pid_t pid) {
  const std::string stat = ReadAll("/proc/" + std::to_string(pid) + "/stat");
  const auto paren = stat.rfind(')');
  return paren == std::string::npos || stat.compare(paren, 3, ") Z") == 0;
}

// A server started at paths it should refuse: it either refuses (it exits, its log says
// why) or, as the old code did, serves (`serving` becomes true). Bounded either way; a
// server that serves is stopped with SIGTERM.
struct Outcome {
  bool served = false;
  int rc = -1;
  std::string log;
};
Outcome RunExpectingRefusal(const std::vector<std::string>& argv, const std::string& log,
                            const std::function<bool()>& serving) {
  Process p(argv, log);
  Outcome o;
  const auto deadline = std::chrono::steady_clock::now() + 30s;  // a bound for the failure
  while (std::chrono::steady_clock::now() < deadline) {
    if (Exited(p.pid())) break;
    if (serving()) {
      o.served = true;
      p.Kill(SIGTERM);
      break;
    }
    std::this_thread::sleep_for(10ms);  // polling a condition with a deadline
  }
  const int status = p.Wait();
  o.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  o.log = ReadAll(log);
  return o;
}

class PathsTest : public ::testing::Test {
 protected:
  std::unique_ptr<Process> StartKeeper(const std::string& sock) {
    auto p = std::make_unique<Process>(std::vector<std::string>{KEEPER_PATH, "--socket=" + sock},
                                       dir_ / "keeper.log");
    const auto deadline = std::chrono::steady_clock::now() + 20s;
    while (!keeper::KeeperClient::Connect(sock).ok()) {
      if (std::chrono::steady_clock::now() > deadline) {
        ADD_FAILURE() << "keeper did not serve: " << ReadAll(dir_ / "keeper.log");
        break;
      }
      std::this_thread::sleep_for(10ms);  // polling a condition with a deadline
    }
    return p;
  }
  bool KeeperServes(const std::string& sock) { return keeper::KeeperClient::Connect(sock).ok(); }

  std::vector<std::string> DaemonArgv(const std::string& socket_dir) {
    return {WEIGHTCACHED_PATH, "--socket_dir=" + socket_dir, "--backend=host",
            "--metrics_address=off", "--keeper_socket=off"};
  }

  TempDir dir_;
};

// Before: `weightcache-keeper --socket=DIR/k.sock` chmod'ed an existing DIR to 0700 and left
// it so (a shared 1777 directory, /tmp-like, lost its other users).
TEST_F(PathsTest, TheKeeperLeavesAShared1777DirectoryAsItWas) {
  const std::string shared = dir_ / "shared";
  ASSERT_EQ(::mkdir(shared.c_str(), 0700), 0);
  ASSERT_EQ(::chmod(shared.c_str(), 01777), 0);
  auto keeper = StartKeeper(shared + "/k.sock");
  EXPECT_EQ(Lstat(shared).st_mode & 07777, 01777u);
  EXPECT_EQ(Lstat(shared + "/k.sock").st_mode & 0777, 0600u);  // its own socket: 0600
  keeper->Kill(SIGTERM);
  keeper->Wait();
  EXPECT_EQ(Lstat(shared).st_mode & 07777, 01777u);
  EXPECT_FALSE(std::filesystem::exists(shared + "/k.sock"));  // its own socket, removed
}

// Before: a regular file or a FIFO at --socket owned by the keeper's uid (root: any root-owned
// file an operator names by mistake) was unlinked and the keeper listened in its place.
TEST_F(PathsTest, TheKeeperRefusesAFileOrAFifoAtItsSocketAndLeavesThem) {
  const std::string file = dir_ / "file.sock";
  std::ofstream(file) << "an operator's file";
  Outcome o = RunExpectingRefusal({KEEPER_PATH, "--socket=" + file}, dir_ / "file.log",
                                  [&] { return KeeperServes(file); });
  EXPECT_FALSE(o.served) << o.log;
  EXPECT_EQ(o.rc, 2) << o.log;
  EXPECT_THAT(o.log,
              HasSubstr("--socket=" + file + ": a regular file is there (not a socket; owner uid " +
                        std::to_string(::geteuid()) + "); remove it or name another path"));
  EXPECT_EQ(ReadAll(file), "an operator's file");

  const std::string fifo = dir_ / "fifo.sock";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  o = RunExpectingRefusal({KEEPER_PATH, "--socket=" + fifo}, dir_ / "fifo.log",
                          [&] { return KeeperServes(fifo); });
  EXPECT_FALSE(o.served) << o.log;
  EXPECT_EQ(o.rc, 2) << o.log;
  EXPECT_THAT(o.log, HasSubstr("--socket=" + fifo + ": a FIFO is there (not a socket"));
  EXPECT_TRUE(S_ISFIFO(Lstat(fifo).st_mode));
}

// A live keeper's socket is never unlinked by a second one started at the same path (one
// started by hand to debug, say): the second refuses, the first keeps serving on its inode.
TEST_F(PathsTest, ASecondKeeperLeavesTheLiveOnesSocket) {
  const std::string sock = dir_ / "k/keeper.sock";
  auto first = StartKeeper(sock);
  const ino_t ino = Lstat(sock).st_ino;
  Outcome o = RunExpectingRefusal({KEEPER_PATH, "--socket=" + sock}, dir_ / "second.log",
                                  [] { return false; });
  EXPECT_EQ(o.rc, 2) << o.log;
  EXPECT_THAT(o.log, HasSubstr("another keeper listens on " + sock));
  EXPECT_EQ(Lstat(sock).st_ino, ino);
  EXPECT_TRUE(KeeperServes(sock));
}

// The restart case: a keeper killed with SIGKILL leaves its socket file; nobody listens on it
// (ECONNREFUSED), so the next keeper replaces it.
TEST_F(PathsTest, AStaleSocketIsReplacedOnRestart) {
  const std::string sock = dir_ / "k/keeper.sock";
  auto first = StartKeeper(sock);
  first->Kill(SIGKILL);
  first->Wait();
  ASSERT_TRUE(S_ISSOCK(Lstat(sock).st_mode));
  auto second = StartKeeper(sock);
  EXPECT_TRUE(KeeperServes(sock));
  EXPECT_THAT(ReadAll(dir_ / "keeper.log"), HasSubstr("removed a stale socket"));
}

// Before: weightcached chmod'ed an existing --socket_dir to 0750 (and with --socket_gid
// chown'ed it to that group), and chmod'ed an existing admin socket dir to 0700. Both are
// the operator's (the chart's hostPath); the daemon now uses them as they are.
TEST_F(PathsTest, TheDaemonLeavesAnExistingSocketDirsModeAndOwner) {
  const std::string s = dir_ / "s";
  const std::string admin = dir_ / "s-admin";
  ASSERT_EQ(::mkdir(s.c_str(), 0755), 0);
  ASSERT_EQ(::mkdir(admin.c_str(), 0711), 0);
  ASSERT_EQ(::chmod(admin.c_str(), 0711), 0);
  const bool root = ::geteuid() == 0;
  const gid_t theirs = root ? 12345 : ::getegid();  // root gives the dir another group
  if (root) ASSERT_EQ(::chown(s.c_str(), static_cast<uid_t>(-1), theirs), 0);
  std::vector<std::string> argv = DaemonArgv(s);
  if (root) argv.emplace_back("--socket_gid=65534");  // the sockets' group, not the dir's
  auto d = testing::StartDaemon(argv, s, dir_ / "daemon.log");
  ASSERT_TRUE(d.ok()) << d.status();
  for (int round = 0; round < 2; ++round) {  // while it serves, then after it stopped
    const struct stat st = Lstat(s);
    EXPECT_EQ(st.st_mode & 07777, 0755u) << round;
    EXPECT_EQ(st.st_gid, theirs) << round;
    EXPECT_EQ(Lstat(admin).st_mode & 07777, 0711u) << round;
    if (round == 0) {
      if (root) EXPECT_EQ(Lstat(s + "/control.sock").st_gid, 65534u);
      d->process->Kill(SIGTERM);
      d->process->Wait();
    }
  }
}

// Before: a regular file of the daemon's uid where control.sock belongs was unlinked.
TEST_F(PathsTest, TheDaemonRefusesAFileWhereItsSocketBelongs) {
  const std::string s = dir_ / "s";
  ASSERT_EQ(::mkdir(s.c_str(), 0750), 0);
  std::ofstream(s + "/control.sock") << "keep me";
  Outcome o = RunExpectingRefusal(DaemonArgv(s), dir_ / "daemon.log", [&] {
    struct stat st {};
    return ::lstat((s + "/control.sock").c_str(), &st) == 0 && S_ISSOCK(st.st_mode);
  });
  EXPECT_FALSE(o.served) << o.log;
  EXPECT_NE(o.rc, 0) << o.log;
  EXPECT_THAT(o.log, HasSubstr(s + "/control.sock: a regular file is there (not a socket"));
  EXPECT_EQ(ReadAll(s + "/control.sock"), "keep me");
}

// A directory others may write without the sticky bit (a Kubernetes emptyDir is 0777) is
// refused by name, not chmod'ed: anyone there could replace the admin socket.
TEST_F(PathsTest, TheDaemonRefusesAWorldWritableAdminDir) {
  const std::string admin = dir_ / "open-admin";
  ASSERT_EQ(::mkdir(admin.c_str(), 0700), 0);
  ASSERT_EQ(::chmod(admin.c_str(), 0777), 0);
  std::vector<std::string> argv = DaemonArgv(dir_ / "s");
  argv.push_back("--admin_socket_dir=" + admin);
  Outcome o = RunExpectingRefusal(argv, dir_ / "daemon.log", [&] {
    return std::filesystem::is_socket(admin + "/control.sock");
  });
  EXPECT_FALSE(o.served) << o.log;
  EXPECT_NE(o.rc, 0) << o.log;
  EXPECT_THAT(o.log,
              HasSubstr("--admin_socket_dir=" + admin + ": directory " + admin + " (mode 0777"));
  EXPECT_EQ(Lstat(admin).st_mode & 07777, 0777u);
}

}  // namespace
}  // namespace weightcache
