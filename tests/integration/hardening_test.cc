// The control plane under an unprivileged peer and under floods (issue 14), real processes on
// the host backend: admin-only operations refused to another uid (through setpriv, as root),
// model roots, the connection cap per process (tenancy_test: per pod), and a descriptor flood the
// daemon survives.
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "pkg/client/client.h"
#include "pkg/safetensors/writer.h"
#include "pkg/util/scoped_fd.h"
#include "pkg/util/unix_socket.h"
#include "tests/integration/daemon_harness.h"
#include "tests/integration/process.h"
#include "tests/testutil/fifo.h"
#include "tests/testutil/temp_dir.h"
#include "weightcache/v1/weightcache.pb.h"

namespace weightcache {
namespace {

using namespace std::chrono_literals;
using ::testing::HasSubstr;
using ::testing::Not;
using testing::Process;
using testing::TempDir;

class HardeningTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::filesystem::create_directories(dir_ / "models");
    ASSERT_TRUE(safetensors::WriteLlamaCheckpoint(dir_ / "models/m", testing::SmallLlama()).ok());
  }
  void Start(std::vector<std::string> extra) {
    std::vector<std::string> argv{WEIGHTCACHED_PATH, "--socket_dir=" + socket_dir(),
                                  "--backend=host", "--metrics_address=off",
                                  "--model=name=m,model_dir=" + dir_ / "models/m"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    auto d = testing::StartDaemon(argv, socket_dir(), dir_ / "daemon.log");
    ASSERT_TRUE(d.ok()) << d.status();
    daemon_ = std::move(d->process);
    client_ = std::move(d->client);
  }
  // weightcachectl as uid/gid 65534 (nobody/nogroup).
  testing::ToolRun CtlAsNobody(const std::vector<std::string>& args) {
    std::vector<std::string> argv{"/usr/bin/setpriv",  "--reuid=65534",
                                  "--regid=65534",     "--clear-groups",
                                  WEIGHTCACHECTL_PATH, "--socket=" + socket_dir()};
    argv.insert(argv.end(), args.begin(), args.end());
    return testing::RunTool(argv, dir_ / "ctl.err");
  }
  std::string socket_dir() const { return dir_ / "s"; }

  TempDir dir_;
  std::unique_ptr<Process> daemon_;
  std::unique_ptr<client::Client> client_;
};

TEST_F(HardeningTest, AnotherUidCannotRedefineEvictOrEndOthersLeases) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to run a client as uid 65534 (setpriv)";
  ::chmod(dir_.path().c_str(), 0755);  // the socket dir's parent: reachable by nobody
  Start({"--socket_gid=65534"});
  // The engine's read access works: status and acquire.
  testing::ToolRun status = CtlAsNobody({"status"});
  EXPECT_EQ(status.rc, 0) << status.out;
  // Redefining model m through an inline spec pointing at its own directory: refused.
  std::ofstream(dir_ / "evil.yaml") << "name: m\nmodel_dir: /tmp\n";
  ::chmod((dir_ / "evil.yaml").c_str(), 0644);
  testing::ToolRun redefine = CtlAsNobody({"--spec=" + dir_ / "evil.yaml", "load"});
  EXPECT_EQ(redefine.rc, 2) << redefine.out;
  EXPECT_THAT(redefine.out, HasSubstr("PERMISSION_DENIED"));
  EXPECT_THAT(redefine.out, HasSubstr("may not define models"));
  testing::ToolRun evict = CtlAsNobody({"evict", "m"});
  EXPECT_EQ(evict.rc, 2) << evict.out;
  EXPECT_THAT(evict.out, HasSubstr("may not evict"));
  // A lease of root's cannot be ended by nobody.
  client::AcquireOptions o;
  o.model = "m";
  o.wait_ready = true;
  auto lease = client_->Acquire(o);
  ASSERT_TRUE(lease.ok()) << lease.status();
  // (weightcachectl has no release command: the raw RPC through a client as nobody.)
  Process releaser({"/usr/bin/setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                    RELEASE_PATH, socket_dir(), (*lease)->id()},
                   dir_ / "release.err");
  auto line = releaser.ReadLine(20s);
  releaser.Wait();
  EXPECT_THAT(line.value_or(""), HasSubstr("PERMISSION_DENIED"));
  EXPECT_THAT(line.value_or(""), HasSubstr("was acquired by another pod or process"));
  auto st = client_->Status();
  ASSERT_TRUE(st.ok());
  ASSERT_EQ(st->entries_size(), 1);
  EXPECT_EQ(st->entries(0).leases_size(), 1);  // still root's
  EXPECT_EQ(st->entries(0).model(), "m");
  // Root, its owner, may.
  EXPECT_TRUE(client_->Release((*lease)->id()).ok());
}

// A daemon whose --model_roots hold m and models/link, a link to a checkpoint outside them.
class RootsTest : public HardeningTest {
 protected:
  void SetUp() override {
    HardeningTest::SetUp();
    ASSERT_TRUE(safetensors::WriteLlamaCheckpoint(dir_ / "elsewhere", testing::SmallLlama()).ok());
    std::filesystem::create_directory_symlink(dir_ / "elsewhere", dir_ / "models/link");
    Start({"--model_roots=" + dir_ / "models", "--preload=false"});
    o_.model = "m";
    o_.load_on_miss = true;
  }
  client::AcquireOptions o_;
};

TEST_F(RootsTest, ModelDirectoriesMustLieUnderTheRoots) {
  EXPECT_TRUE(client_->Acquire(o_).ok());
  // A spec whose dir is a link out of the roots, even from the operator (admin socket):
  // refused, naming the rule and the target.
  auto s = testing::AdminClient(socket_dir())
               ->Load("", "name: escape\nmodel_dir: " + dir_ / "models/link\n", {});
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("is not under the daemon's --model_roots"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("resolves to " + dir_ / "elsewhere"));
}

// A refused inline spec leaves nothing behind (issue 26): its name stays unknown, and a
// configured model it tried to replace keeps its own spec (before, the refused spec stayed
// defined, and engines' later Loads and Acquires of the name used it).
TEST_F(RootsTest, ARefusedInlineSpecLeavesTheNameAsItWas) {
  client::AcquireOptions o = o_;
  auto before = client_->Acquire(o);
  ASSERT_TRUE(before.ok()) << before.status();
  const std::string fingerprint = (*before)->fingerprint();
  before->reset();
  auto admin = testing::AdminClient(socket_dir());
  for (const std::string name : {"escape", "m"}) {
    auto s = admin->Load("", "name: " + name + "\nmodel_dir: " + dir_ / "models/link\n", {});
    EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << name << ": " << s;
  }
  o.model = "escape";
  auto unknown = client_->Acquire(o);
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kNotFound) << unknown.status();
  EXPECT_THAT(std::string(unknown.status().message()), HasSubstr("not known"));
  o.model = "m";
  auto after = client_->Acquire(o);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ((*after)->fingerprint(), fingerprint) << "m is served under its own spec";
  EXPECT_TRUE(client_->Load("m", "", {}).ok());  // and an engine's Load of it reads its files
}

// Raw connections to the control socket (no HTTP/2): they hold descriptors and count.
ScopedFd RawConnect(const std::string& path) {
  auto fd = ConnectUnix(path);
  return fd.ok() ? std::move(fd).value() : ScopedFd();
}

// Issue 47, finding 2: the cap was per uid, so one root process (or pod) holding its cap left
// every other root client refused. Outside Kubernetes the process is the unit: this test
// process filling its cap (and the connections over it) leaves weightcachectl, another
// process of the same uid, served. (Told-so past the cap: tenancy_test, with pods.)
TEST_F(HardeningTest, AProcessOverItsConnectionCapDoesNotStarveAnotherOfTheSameUid) {
  Start({"--max_connections_per_pod=3"});
  // The harness's client holds one connection; raw ones fill this process's cap and the 4
  // over-cap connections it may hold.
  std::vector<ScopedFd> held;
  for (int i = 0; i < 8; ++i) held.push_back(RawConnect(socket_dir() + "/control.sock"));
  testing::ToolRun other;
  for (int i = 0; i < 5; ++i) {
    other = testing::RunTool({WEIGHTCACHECTL_PATH, "--socket=" + socket_dir(), "status"},
                             dir_ / "c.err");
    EXPECT_EQ(other.rc, 0) << other.out;  // before: RESOURCE_EXHAUSTED "... per uid"
  }
  EXPECT_THAT(other.out, Not(HasSubstr("RESOURCE_EXHAUSTED")));
}

// Finding (issue 26): every name a peer asked for became a metric label until the 256 slots
// were full, so any client could push the real models' series into "_other". Names that no
// spec defines are now counted as "_unknown".
TEST_F(HardeningTest, UnknownModelNamesDoNotTakeTheMetricLabelSlots) {
  Start({"--metrics_address=127.0.0.1:0"});
  client::AcquireOptions o;
  for (int i = 0; i < 300; ++i) {
    o.model = "nosuch-" + std::to_string(i);
    EXPECT_EQ(client_->Acquire(o).status().code(), absl::StatusCode::kNotFound) << o.model;
  }
  o.model = "m";
  o.load_on_miss = true;
  o.wait_ready = true;
  ASSERT_TRUE(client_->Acquire(o).ok());
  const int port = testing::MetricsPort(dir_ / "daemon.log");
  ASSERT_GT(port, 0) << testing::ReadFileOrEmpty(dir_ / "daemon.log");
  const std::string scrape = testing::Scrape(port);
  EXPECT_THAT(scrape,
              HasSubstr("weightcache_acquire_total{model=\"_unknown\",result=\"miss\"} 300"));
  EXPECT_THAT(scrape, HasSubstr("weightcache_acquire_total{model=\"m\",result=\""));  // hit or miss
  EXPECT_THAT(scrape, Not(HasSubstr("nosuch-")));
}

// Out of descriptors (a low RLIMIT_NOFILE and idle connections holding them all): the daemon
// stays up, and once the connections close it accepts again.
TEST_F(HardeningTest, DescriptorFloodDoesNotLeaveTheListenerDead) {
  std::vector<std::string> argv{"/usr/bin/prlimit",
                                "--nofile=128:128",
                                WEIGHTCACHED_PATH,
                                "--socket_dir=" + socket_dir(),
                                "--backend=host",
                                "--metrics_address=off",
                                "--model=name=m,model_dir=" + dir_ / "models/m"};
  auto d = testing::StartDaemon(argv, socket_dir(), dir_ / "daemon.log");
  ASSERT_TRUE(d.ok()) << d.status();
  std::vector<ScopedFd> flood;
  for (int i = 0; i < 300; ++i) {
    if (ScopedFd fd = RawConnect(socket_dir() + "/control.sock")) flood.push_back(std::move(fd));
  }
  // Until the daemon has hit EMFILE (the point of the test): it accepts the queued
  // connections at its own pace, slower under a sanitizer on a busy machine.
  EXPECT_TRUE(testing::WaitForLogLine(dir_ / "daemon.log", "Too many open files; retrying"))
      << testing::ReadFileOrEmpty(dir_ / "daemon.log");
  EXPECT_NE(::kill(d->process->pid(), 0), -1) << "the daemon died";
  flood.clear();
  // A new connection from another process (clients in one process share theirs).
  testing::ToolRun served;
  for (int i = 0; i < 100; ++i) {  // a bounded poll
    served = testing::RunTool({WEIGHTCACHECTL_PATH, "--socket=" + socket_dir(), "status"},
                              dir_ / "c.err");
    if (served.rc == 0) break;
    std::this_thread::sleep_for(50ms);
  }
  EXPECT_EQ(served.rc, 0) << served.out << testing::ReadFileOrEmpty(dir_ / "daemon.log");
  EXPECT_THAT(testing::ReadFileOrEmpty(dir_ / "daemon.log"), HasSubstr("accepting again"));
}

// Finding: a FIFO as a preloaded model's config.json kept the daemon from ever creating
// control.sock, and SIGTERM then aborted it, leaving a stale handle.sock. Now the preload
// fails at once naming the FIFO, the other model serves, and SIGTERM exits 0 cleanly.
TEST_F(HardeningTest, FifoConfigInAPreloadNeitherBlocksServingNorShutdown) {
  std::filesystem::create_directories(dir_ / "models/fifo");
  testing::FifoGuard fifo(dir_ / "models/fifo/config.json");
  std::ofstream(dir_ / "specs.yaml") << "models:\n"
                                     << "  - {name: f, model_dir: " << dir_ / "models/fifo"
                                     << "}\n  - {name: m, model_dir: " << dir_ / "models/m"
                                     << "}\n";
  auto d =
      testing::StartDaemon({WEIGHTCACHED_PATH, "--socket_dir=" + socket_dir(), "--backend=host",
                            "--metrics_address=off", "--spec_file=" + dir_ / "specs.yaml"},
                           socket_dir(), dir_ / "daemon.log");
  ASSERT_TRUE(d.ok()) << d.status();
  daemon_ = std::move(d->process);
  client_ = std::move(d->client);
  client::AcquireOptions o;
  o.model = "m";
  o.wait_ready = true;
  auto lease = client_->Acquire(o);
  EXPECT_TRUE(lease.ok()) << lease.status();
  o.model = "f";
  auto bad = client_->Acquire(o);
  EXPECT_FALSE(bad.ok());
  testing::ToolRun list =
      testing::RunTool({WEIGHTCACHECTL_PATH, "--socket=" + socket_dir(), "list"}, dir_ / "ctl.err");
  EXPECT_THAT(list.out, HasSubstr("not a regular file"));
  EXPECT_FALSE(fifo.fired()) << "something blocked on the FIFO";
  daemon_->Kill(SIGTERM);
  EXPECT_EQ(daemon_->Wait(), 0) << testing::ReadFileOrEmpty(dir_ / "daemon.log");
  EXPECT_FALSE(std::filesystem::exists(socket_dir() + "/control.sock"));
  EXPECT_FALSE(std::filesystem::exists(socket_dir() + "/handle.sock"));
}

}  // namespace
}  // namespace weightcache
