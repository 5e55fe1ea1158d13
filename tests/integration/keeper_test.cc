// The keeper with real processes on the host backend (issue 16): weightcached SIGKILLed and
// restarted serves the same entries again from weightcache-keeper without reading the
// checkpoint; clients that mapped before keep their bytes; a chaos run of 16 clients over 20
// daemon kills; a killed keeper breaks nothing and gets the entries again when it is back;
// the keeper never loads CUDA.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "pkg/client/client.h"
#include "pkg/identity/identity.h"
#include "pkg/keeper/client.h"
#include "pkg/safetensors/writer.h"
#include "pkg/util/unix_socket.h"
#include "tests/integration/daemon_harness.h"
#include "tests/integration/process.h"
#include "tests/testutil/temp_dir.h"

namespace weightcache {
namespace {

using namespace std::chrono_literals;
using testing::Process;
using testing::ProcIo;
using testing::TempDir;

const v1::EntryInfo* Entry(const v1::StatusResponse& st, const std::string& model) {
  for (const auto& e : st.entries()) {
    if (e.model() == model) return &e;
  }
  return nullptr;
}

class KeeperTest : public ::testing::Test {
 protected:
  void SetUp() override {
    shape_ = testing::SmallLlama();
    shape_.hidden = 512;  // ~ 13 MB: a reload would show in rchar
    shape_.intermediate = 2048;
    shape_.vocab = 4096;
    ASSERT_TRUE(safetensors::WriteLlamaCheckpoint(dir_ / "m", shape_).ok());
    model_bytes_ = std::filesystem::file_size(dir_ / "m/model.safetensors");
  }

  std::string keeper_sock() const { return dir_ / "k/keeper.sock"; }
  std::string socket_dir() const { return dir_ / "s"; }

  std::unique_ptr<Process> StartKeeper() {
    return testing::StartKeeper(KEEPER_PATH, keeper_sock(), dir_ / "keeper.log");
  }

  std::vector<std::string> DaemonArgv() const {
    return {WEIGHTCACHED_PATH,
            "--socket_dir=" + socket_dir(),
            "--backend=host",
            "--metrics_address=off",
            "--keeper_socket=" + keeper_sock(),
            "--model=name=m,model_dir=" + dir_ / "m",
            "--publish_uids=" + std::to_string(::geteuid())};  // a publisher of one test
  }

  // Starts weightcached; returns once `m` is ready and the keeper holds it (deposits
  // follow readiness).
  std::unique_ptr<Process> StartDaemon(const std::vector<std::string>& extra = {}) {
    std::vector<std::string> argv = DaemonArgv();
    argv.insert(argv.end(), extra.begin(), extra.end());
    auto d = testing::StartDaemon(argv, socket_dir(), dir_ / "daemon.log",
                                  [](const v1::StatusResponse& st) {
                                    const auto* e = Entry(st, "m");
                                    return e != nullptr && e->state() == "ready" &&
                                           st.keeper().up() && st.keeper().pending_entries() == 0;
                                  });
    EXPECT_TRUE(d.ok()) << d.status();
    if (!d.ok()) return nullptr;
    client_ = std::move(d->client);
    return std::move(d->process);
  }

  // Starts weightcached with two models, m and m2 (other bytes), neither loaded yet.
  std::unique_ptr<Process> StartTwoModelDaemon(const std::string& keeper_timeout) {
    safetensors::LlamaShape other = shape_;
    other.seed = 9;  // other bytes: its own entry
    EXPECT_TRUE(safetensors::WriteLlamaCheckpoint(dir_ / "m2", other).ok());
    std::ofstream(dir_ / "specs.yaml") << "models:\n  - {name: m, model_dir: " << dir_ / "m"
                                       << "}\n  - {name: m2, model_dir: " << dir_ / "m2"
                                       << "}\n";
    std::vector<std::string> argv;
    for (const auto& a : DaemonArgv()) {
      if (a.rfind("--model=", 0) != 0) argv.push_back(a);
    }
    argv.push_back("--spec_file=" + dir_ / "specs.yaml");
    argv.emplace_back("--preload=false");
    argv.push_back("--keeper_timeout=" + keeper_timeout);
    auto d = testing::StartDaemon(argv, socket_dir(), dir_ / "daemon.log");
    EXPECT_TRUE(d.ok()) << d.status();
    if (!d.ok()) return nullptr;
    client_ = std::move(d->client);
    return std::move(d->process);
  }

  std::unique_ptr<Process> StartClient() {
    auto c = std::make_unique<Process>(
        std::vector<std::string>{TEST_CLIENT_PATH, socket_dir() + "/control.sock", "m"},
        dir_ / "client.log");
    auto ok = c->WaitFor("BYTES", 20s);
    EXPECT_EQ(ok.value_or("none"), "BYTES OK") << testing::ReadFileOrEmpty(dir_ / "daemon.log");
    return c;
  }

  // Until the keeper holds what the daemon has ready (and nothing else).
  v1::StatusResponse WaitInStep(std::chrono::seconds within = 20s) {
    return testing::WaitForStatus(
        *client_,
        [](const v1::StatusResponse& s) {
          return s.keeper().up() && s.keeper().pending_entries() == 0;
        },
        within);
  }

  // SIGKILLs the daemon and waits for it; its client goes with it.
  void Crash(Process& daemon) {
    daemon.Kill(SIGKILL);
    daemon.Wait();
    client_.reset();
  }

  std::string KeeperStats() {
    auto c = keeper::KeeperClient::Connect(keeper_sock());
    if (!c.ok()) return std::string(c.status().message());
    auto s = (*c)->Stats();
    return s.ok() ? *s : std::string(s.status().message());
  }

  TempDir dir_;
  safetensors::LlamaShape shape_;
  uint64_t model_bytes_ = 0;
  std::unique_ptr<client::Client> client_;
};

TEST_F(KeeperTest, SigkilledDaemonRestartsServingFromTheKeeperWithoutReadingTheCheckpoint) {
  auto keeper = StartKeeper();
  auto daemon = StartDaemon();
  ASSERT_TRUE(daemon);
  auto st = client_->Status();
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(Entry(*st, "m")->source(), "disk");
  EXPECT_TRUE(st->keeper().up());
  EXPECT_EQ(st->keeper().deposits(), 1u);
  EXPECT_GT(st->keeper().descriptors(), 0u);
  const std::string fingerprint = Entry(*st, "m")->fingerprint();
  auto before = StartClient();  // maps the daemon's copy and keeps it

  Crash(*daemon);
  daemon = StartDaemon();
  ASSERT_TRUE(daemon);
  st = client_->Status();
  ASSERT_TRUE(st.ok());
  const auto* e = Entry(*st, "m");
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->source(), "keeper");
  EXPECT_EQ(e->fingerprint(), fingerprint);
  EXPECT_EQ(st->keeper().adopted_entries(), 1u);
  EXPECT_EQ(st->keeper().dropped_entries(), 0u);
  // Nothing of the checkpoint was read: its headers and config are a few KiB, the model
  // ~13 MB (a reload reads it all, page cache or not).
  const uint64_t rchar = ProcIo(daemon->pid(), "rchar");
  EXPECT_LT(rchar, model_bytes_ / 8) << "the restarted daemon read " << rchar << " bytes";
  std::printf("restarted daemon: rchar %llu bytes (model %llu bytes), source %s\n",
              static_cast<unsigned long long>(rchar), static_cast<unsigned long long>(model_bytes_),
              e->source().c_str());

  // What people see.
  testing::ToolRun ctl = testing::RunTool(
      {WEIGHTCACHECTL_PATH, "--socket=" + socket_dir(), "status"}, dir_ / "ctl.err");
  EXPECT_EQ(ctl.rc, 0) << ctl.out;
  EXPECT_THAT(ctl.out, ::testing::HasSubstr("(from the keeper)"));
  EXPECT_THAT(ctl.out, ::testing::HasSubstr(": connected; 1 entries adopted at start, 0 dropped"));

  auto after = StartClient();  // a new client maps the adopted entry: correct bytes
  // The client that mapped before the crash is still alive and holds its lease.
  EXPECT_TRUE(before->WriteLine("still there"));
  before->CloseStdin();
  EXPECT_EQ(before->Wait(), 0);
}

// Issue 48, pinned digests: a restarted daemon that has lost its digest store (a new node
// disk, a wiped state dir) but is given the files' SHA-256 in its spec names the kept entry
// without reading the checkpoint: the same fingerprint, 0 bytes hashed, the entry served.
// Without the pins the same restart must hash every file to know what it holds.
TEST_F(KeeperTest, APinnedSpecNamesAKeptEntryWithoutHashingAfterTheDigestStoreIsLost) {
  auto keeper = StartKeeper();
  auto daemon = StartDaemon();
  ASSERT_TRUE(daemon);
  const v1::StatusResponse first = WaitInStep();
  EXPECT_EQ(first.hashed_bytes(), model_bytes_);  // the first node hashed the file
  const std::string fingerprint = Entry(first, "m")->fingerprint();
  std::ifstream in(dir_ / "m/model.safetensors", std::ios::binary);
  std::stringstream bytes;
  bytes << in.rdbuf();
  std::ofstream(dir_ / "pinned.yaml")
      << "models:\n  - name: m\n    model_dir: " << dir_ / "m"
      << "\n    digests:\n      model.safetensors: " << identity::Sha256Hex(bytes.str()) << "\n";
  Crash(*daemon);

  std::vector<std::string> argv;
  for (const auto& a : DaemonArgv()) {
    if (a.rfind("--model=", 0) != 0) argv.push_back(a);
  }
  argv.push_back("--spec_file=" + dir_ / "pinned.yaml");
  argv.push_back("--digest_store=" + dir_ / "empty-state/digests.json");
  auto d = testing::StartDaemon(argv, socket_dir(), dir_ / "daemon.log",
                                [](const v1::StatusResponse& s) {
                                  const auto* e = Entry(s, "m");
                                  return e != nullptr && e->state() == "ready";
                                });
  ASSERT_TRUE(d.ok()) << d.status();
  daemon = std::move(d->process);
  client_ = std::move(d->client);
  auto client = StartClient();  // an Acquire by name: the fingerprint from the pins
  auto st = client_->Status();
  ASSERT_TRUE(st.ok());
  const auto* e = Entry(*st, "m");
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->source(), "keeper");
  EXPECT_EQ(e->fingerprint(), fingerprint);
  EXPECT_GE(st->acquire_hits(), 1u) << st->DebugString();
  EXPECT_EQ(st->hashed_bytes(), 0u);
  const uint64_t rchar = ProcIo(daemon->pid(), "rchar");
  EXPECT_LT(rchar, model_bytes_ / 8) << "the restarted daemon read " << rchar << " bytes";
  client->CloseStdin();
  EXPECT_EQ(client->Wait(), 0);
}

// Without a keeper (--keeper_socket=off) status says so in a plain line, not as a warning about
// a keeper it never asked for (issue 45: the demo's status showed "NOT connected").
TEST_F(KeeperTest, StatusSaysPlainlyWhenNoKeeperIsConfigured) {
  std::vector<std::string> argv = DaemonArgv();
  argv.push_back("--keeper_socket=off");  // the last value of a flag wins
  auto d = testing::StartDaemon(argv, socket_dir(), dir_ / "daemon.log",
                                [](const v1::StatusResponse& st) {
                                  const auto* e = Entry(st, "m");
                                  return e != nullptr && e->state() == "ready";
                                });
  ASSERT_TRUE(d.ok()) << d.status();
  testing::ToolRun ctl = testing::RunTool(
      {WEIGHTCACHECTL_PATH, "--socket=" + socket_dir(), "status"}, dir_ / "ctl.err");
  EXPECT_EQ(ctl.rc, 0) << ctl.out;
  EXPECT_THAT(ctl.out, ::testing::HasSubstr("keeper: none (--keeper_socket=off): a restarted "
                                            "daemon loads its models from disk again"));
  EXPECT_THAT(ctl.out, ::testing::Not(::testing::HasSubstr("NOT connected")));
}

TEST_F(KeeperTest, AStaleEntryIsDroppedAtAdoptionAndLoadedAgain) {
  auto keeper = StartKeeper();
  auto daemon = StartDaemon();
  ASSERT_TRUE(daemon);
  daemon->Kill(SIGKILL);
  daemon->Wait();
  // The checkpoint changes while no daemon runs.
  shape_.seed = 77;
  ASSERT_TRUE(safetensors::WriteLlamaCheckpoint(dir_ / "m", shape_).ok());
  daemon = StartDaemon();
  ASSERT_TRUE(daemon);
  auto st = client_->Status();
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->keeper().adopted_entries(), 0u);
  EXPECT_EQ(st->keeper().dropped_entries(), 1u);
  EXPECT_NE(st->keeper().last_error().find("stale: model.safetensors"), std::string::npos)
      << st->keeper().last_error();
  EXPECT_EQ(Entry(*st, "m")->source(), "disk");
  auto c = StartClient();  // the new bytes
  auto stats = keeper::KeeperClient::Connect(keeper_sock()).value()->Stats();
  EXPECT_EQ(stats.value_or(""), absl::StrCat("entries=1 fds=", st->entries(0).segments(),
                                             stats.value_or("").substr(stats->find(" max_fds"))));
}

TEST_F(KeeperTest, KilledKeeperBreaksNothingAndGetsTheEntriesAgainWhenBack) {
  auto keeper = StartKeeper();
  auto daemon = StartDaemon();
  ASSERT_TRUE(daemon);
  auto before = StartClient();
  keeper->Kill(SIGKILL);
  keeper->Wait();
  auto st = testing::WaitForStatus(
      *client_, [](const v1::StatusResponse& s) { return !s.keeper().up(); }, 10s);
  EXPECT_FALSE(st.keeper().up());
  EXPECT_NE(st.keeper().last_error().find("keeper closed its connection"), std::string::npos)
      << st.keeper().last_error();
  // The link publishes "down" before it logs why: wait for the line, do not read it once
  // (under ASan on a busy machine the status came first, 2026-12-03).
  EXPECT_TRUE(testing::WaitForLogLine(dir_ / "daemon.log", "keeper: lost"))
      << testing::ReadFileOrEmpty(dir_ / "daemon.log");
  auto during = StartClient();  // serving goes on

  keeper = StartKeeper();
  st = testing::WaitForStatus(
      *client_,
      [](const v1::StatusResponse& s) { return s.keeper().up() && s.keeper().descriptors() > 0; },
      10s);
  EXPECT_EQ(st.keeper().deposits(), 2u);  // at load, and again for the new keeper
  // And the new keeper's copy is what a restarted daemon adopts.
  daemon->Kill(SIGKILL);
  daemon->Wait();
  daemon = StartDaemon();
  ASSERT_TRUE(daemon);
  auto again = client_->Status();
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(Entry(*again, "m")->source(), "keeper");
  before->CloseStdin();
  EXPECT_EQ(before->Wait(), 0);
}

// A peer that gives up waiting in the keeper's backlog (a daemon's link tries again every
// 250 ms while the keeper is stopped) does not end the keeper once it runs again: before,
// failing to greet such a peer skipped joining the threads of the connections that had
// ended meanwhile, and the keeper aborted ("terminate called without an active exception"),
// releasing every entry it held.
TEST_F(KeeperTest, APeerThatGaveUpInTheBacklogDoesNotEndIt) {
  auto keeper = StartKeeper();
  auto count = [&](const std::string& what) {
    const std::string log = testing::ReadFileOrEmpty(dir_ / "keeper.log");
    int n = 0;
    for (size_t at = log.find(what); at != std::string::npos; at = log.find(what, at + 1)) ++n;
    return n;
  };
  {
    std::vector<std::unique_ptr<keeper::KeeperClient>> served;
    for (int i = 0; i < 8; ++i) {
      auto c = keeper::KeeperClient::Connect(keeper_sock());
      ASSERT_TRUE(c.ok()) << c.status();
      served.push_back(std::move(c).value());
    }
  }
  // Ended: their threads are joined when the next peer is accepted.
  const auto deadline = std::chrono::steady_clock::now() + 20s;
  while (
      std::chrono::steady_clock::now() < deadline &&
      !(count("peer disconnected") >= 8 && count("peer disconnected") == count("peer connected"))) {
    std::this_thread::sleep_for(10ms);  // polling a condition with a deadline
  }
  keeper->Kill(SIGSTOP);
  ASSERT_TRUE(ConnectUnixNoWait(keeper_sock(), SOCK_SEQPACKET).ok());  // queued, closed at once
  keeper->Kill(SIGCONT);
  std::string stats;
  while (std::chrono::steady_clock::now() < deadline) {
    stats = KeeperStats();
    if (stats.rfind("entries=", 0) == 0) break;
    std::this_thread::sleep_for(10ms);  // polling a condition with a deadline
  }
  EXPECT_EQ(stats.substr(0, 10), "entries=0 ") << testing::ReadFileOrEmpty(dir_ / "keeper.log");
  keeper->Kill(SIGTERM);
  const int status = keeper->Wait();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << status << testing::ReadFileOrEmpty(dir_ / "keeper.log");
}

TEST_F(KeeperTest, KeeperNeverLoadsCuda) {
  // Its link line: no CUDA library, nor gRPC (it stays small and rarely changes).
  testing::ToolRun r = testing::RunTool({"/usr/bin/readelf", "-d", KEEPER_PATH}, dir_ / "re.err");
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("NEEDED"), std::string::npos) << r.out;
  for (const char* lib : {"libcuda", "libcudart", "libnvidia", "libgrpc"}) {
    EXPECT_EQ(r.out.find(lib), std::string::npos) << lib << " in\n" << r.out;
  }
  // Its mappings while it holds a deposit from a real daemon.
  auto keeper = StartKeeper();
  auto daemon = StartDaemon();
  ASSERT_TRUE(daemon);
  const std::string maps =
      testing::ReadFileOrEmpty("/proc/" + std::to_string(keeper->pid()) + "/maps");
  ASSERT_FALSE(maps.empty());
  EXPECT_NE(maps.find("weightcache-keeper"), std::string::npos);
  for (const char* lib : {"libcuda", "libcudart", "libnvidia"}) {
    EXPECT_EQ(maps.find(lib), std::string::npos) << lib << " mapped by the keeper";
  }
  // And the open-file limit went up to the hard limit at start.
  const std::string limits =
      testing::ReadFileOrEmpty("/proc/" + std::to_string(keeper->pid()) + "/limits");
  std::istringstream in(limits.substr(limits.find("Max open files")));
  std::string w1, w2, w3, soft, hard;
  in >> w1 >> w2 >> w3 >> soft >> hard;
  EXPECT_EQ(soft, hard) << limits;
}

// 16 clients acquire, check and release in a loop, each also holding its first lease,
// while the daemon is SIGKILLed and restarted 20 times. Each restart's time to the first
// successful Acquire is printed (the goal is 1 s; the bound here is generous: CI has 2 cores
// shared by 16 clients).
TEST_F(KeeperTest, ChaosSixteenClientsTwentyDaemonKills) {
  constexpr int kClients = 16, kRestarts = 20;
  auto keeper = StartKeeper();
  auto daemon = StartDaemon();
  ASSERT_TRUE(daemon);
  std::vector<std::unique_ptr<Process>> clients;
  for (int i = 0; i < kClients; ++i) {
    clients.push_back(std::make_unique<Process>(
        std::vector<std::string>{CHAOS_CLIENT_PATH, socket_dir() + "/control.sock", "m",
                                 dir_ / "m"},
        dir_ / ("chaos" + std::to_string(i) + ".log")));
    ASSERT_TRUE(clients.back()->WaitFor("STARTED", 20s).has_value());
  }
  std::vector<double> first_acquire;
  for (int round = 0; round < kRestarts; ++round) {
    daemon->Kill(SIGKILL);
    daemon->Wait();
    const auto t0 = std::chrono::steady_clock::now();
    daemon = std::make_unique<Process>(DaemonArgv(), dir_ / "daemon.log");
    // The first successful Acquire through a fresh client, polled.
    double secs = -1;
    while (std::chrono::steady_clock::now() - t0 < 30s) {
      auto c = client::Client::Connect(socket_dir() + "/control.sock");
      if (c.ok()) {
        client::AcquireOptions o;
        o.model = "m";
        o.timeout = 2s;
        if ((*c)->Acquire(o).ok()) {
          secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          break;
        }
      }
      std::this_thread::sleep_for(5ms);
    }
    ASSERT_GE(secs, 0) << "round " << round << ": no Acquire within 30 s\n"
                       << testing::ReadFileOrEmpty(dir_ / "daemon.log");
    first_acquire.push_back(secs);
    std::this_thread::sleep_for(100ms);  // let the clients run against this daemon a little
  }
  std::printf("\n| restart | SIGKILL -> first successful Acquire (s) |\n|---|---|\n");
  double worst = 0;
  for (size_t i = 0; i < first_acquire.size(); ++i) {
    std::printf("| %zu | %.3f |\n", i + 1, first_acquire[i]);
    worst = std::max(worst, first_acquire[i]);
  }
  std::printf("worst %.3f s over %d restarts, %d clients\n", worst, kRestarts, kClients);
  EXPECT_LT(worst, 10.0);  // generous: the goal is 1 s on an idle node

  uint64_t total_ok = 0;
  for (int i = 0; i < kClients; ++i) {
    clients[i]->CloseStdin();
    auto line = clients[i]->WaitFor("STATS", 30s);
    ASSERT_TRUE(line.has_value()) << "client " << i << " crashed or hung: "
                                  << testing::ReadFileOrEmpty(
                                         dir_ / ("chaos" + std::to_string(i) + ".log"));
    unsigned long long ok = 0, wrong = 0, errors = 0, held = 0;
    ASSERT_EQ(std::sscanf(line->c_str(), "STATS ok=%llu wrong=%llu errors=%llu held_ok=%llu", &ok,
                          &wrong, &errors, &held),
              4);
    EXPECT_EQ(wrong, 0u) << "client " << i;
    EXPECT_GT(ok, 0u) << "client " << i;
    total_ok += ok;
    const int status = clients[i]->Wait();
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "client " << i << ": " << status;
  }
  std::printf("clients: %llu checked acquires, 0 wrong bytes\n",
              static_cast<unsigned long long>(total_ok));
  // The last daemon still runs: its status shows the adoption.
  auto c = client::Client::Connect(socket_dir() + "/control.sock");
  ASSERT_TRUE(c.ok());
  auto s = (*c)->Status();
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(Entry(*s, "m")->source(), "keeper");
}

// A published entry (engine-processed bytes that no disk load can reproduce) is deposited
// like a loaded one: after a SIGKILL the restarted daemon serves it from the keeper, and a
// publisher of the same key joins it instead of publishing again.
TEST_F(KeeperTest, APublishedEntryOutlivesADaemonRestart) {
  auto keeper = StartKeeper();
  auto daemon = StartDaemon();
  ASSERT_TRUE(daemon);
  const std::vector<std::string> argv{
      PUBLISH_CLIENT_PATH, socket_dir() + "/control.sock", "m", "scaled-v1", "7", "commit"};
  Process publisher(argv, dir_ / "publisher.log");
  auto committed = publisher.WaitFor("COMMITTED", 20s);
  ASSERT_TRUE(committed.has_value()) << testing::ReadFileOrEmpty(dir_ / "publisher.log");
  WaitInStep();
  const std::string fingerprint = committed->substr(committed->find(' ') + 1);
  EXPECT_EQ(publisher.WaitFor("BYTES", 20s).value_or("none"), "BYTES OK");
  publisher.CloseStdin();
  EXPECT_EQ(publisher.Wait(), 0);

  daemon->Kill(SIGKILL);
  daemon->Wait();
  client_.reset();
  daemon = StartDaemon();
  ASSERT_TRUE(daemon);
  auto st = client_->Status();
  ASSERT_TRUE(st.ok());
  const v1::EntryInfo* published = nullptr;
  for (const auto& e : st->entries()) {
    if (e.fingerprint() == fingerprint) published = &e;
  }
  ASSERT_NE(published, nullptr) << "the published entry was not adopted: " << st->DebugString()
                                << testing::ReadFileOrEmpty(dir_ / "daemon.log");
  EXPECT_EQ(published->source(), "keeper");
  EXPECT_EQ(published->state(), "ready");
  // Who published it came back with it (the keeper's record holds it).
  EXPECT_EQ(published->publisher().engine(), "testengine");
  EXPECT_EQ(published->publisher().engine_version(), "1.0");
  EXPECT_EQ(published->publisher().recipe(), "scaled-v1");
  EXPECT_GT(published->publisher().pid(), 0);
  EXPECT_GT(published->publisher().published_unix_seconds(), 1.7e9);
  EXPECT_EQ(st->keeper().adopted_entries(), 2u);  // the loaded m and the published one

  Process again(argv, dir_ / "again.log");
  auto joined = again.WaitFor("JOINED", 20s);
  EXPECT_EQ(joined.value_or("none"), "JOINED " + fingerprint)
      << testing::ReadFileOrEmpty(dir_ / "again.log");
  EXPECT_EQ(again.WaitFor("BYTES", 20s).value_or("none"), "BYTES OK");
  again.CloseStdin();
  EXPECT_EQ(again.Wait(), 0);
}

// A compile artifact (issue 29) outlives a daemon restart through the keeper, as entries do:
// deposited once put (one sealed memfd), taken back at the restart with its publisher and
// served byte for byte without --artifact_dir; an admin's evict drops it from the keeper.
TEST_F(KeeperTest, AnArtifactOutlivesADaemonRestartThroughTheKeeper) {
  auto keeper = StartKeeper();
  auto daemon = StartDaemon();
  ASSERT_TRUE(daemon);
  v1::ArtifactKey key;
  key.set_kind("torch-compile");
  key.set_model("m");
  key.set_fingerprint("wc1-test");
  key.set_torch_version("2.11.0");
  std::string blob((2 << 20) + 5, '\0');
  for (size_t i = 0; i < blob.size(); ++i) blob[i] = static_cast<char>(i * 131 + 7);
  auto put = client_->PutArtifact(key, blob);
  ASSERT_TRUE(put.ok()) << put.status();
  auto in_step = testing::WaitForStatus(
      *client_,
      [](const v1::StatusResponse& s) {
        return s.keeper().up() && s.keeper().pending_entries() == 0 && s.keeper().artifacts() == 1;
      },
      20s);
  EXPECT_EQ(in_step.keeper().artifacts(), 1u) << in_step.keeper().DebugString();
  EXPECT_THAT(KeeperStats(), ::testing::HasSubstr("entries=2 "));  // m and the artifact

  daemon->Kill(SIGKILL);
  daemon->Wait();
  client_.reset();
  daemon = StartDaemon();
  ASSERT_TRUE(daemon);
  auto st = client_->Status();
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->keeper().adopted_artifacts(), 1u) << testing::ReadFileOrEmpty(dir_ / "daemon.log");
  ASSERT_EQ(st->artifacts_size(), 1);
  EXPECT_EQ(st->artifacts(0).id(), put->id());
  EXPECT_EQ(st->artifacts(0).sha256(), put->sha256());
  EXPECT_GT(st->artifacts(0).publisher().pid(), 0);
  auto got = client_->GetArtifact(key);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ((*got)->size(), blob.size());
  EXPECT_EQ(std::string(static_cast<const char*>((*got)->data()), blob.size()), blob);

  auto admin = testing::AdminClient(socket_dir());
  ASSERT_TRUE(admin);
  auto evicted = admin->EvictArtifacts(put->id(), "");
  ASSERT_TRUE(evicted.ok()) << evicted.status();
  EXPECT_EQ(*evicted, 1u);
  auto dropped = testing::WaitForStatus(
      *client_,
      [](const v1::StatusResponse& s) {
        return s.keeper().pending_entries() == 0 && s.keeper().artifacts() == 0;
      },
      20s);
  EXPECT_EQ(dropped.keeper().artifacts(), 0u);
  EXPECT_THAT(KeeperStats(), ::testing::HasSubstr("entries=1 "));
}

// A frozen keeper (SIGSTOP: it accepts nothing and answers nothing) costs the daemon's
// clients nothing: Status, an Acquire of a ready model, an Evict, a Load and a publish's
// commit each answer without waiting on it (before, they took 18 to 32 s). The daemon runs
// with a 60 s --keeper_timeout, so a call that waited on the keeper even once would take a
// minute; an honest call takes 0.1 s idle and took 6.4 s on a busy 2-core CI machine (the
// publish, a new process). Once the keeper runs again the link is in step: the evicted entry
// dropped from it, the newly loaded and the published ones deposited. A SIGTERM while it is
// frozen exits 0 by itself (the link's I/O is cut, not waited out).
TEST_F(KeeperTest, AFrozenKeeperNeverStopsTheDaemonFromServing) {
  auto keeper = StartKeeper();
  constexpr double kKeeperTimeout = 60.0;
  auto daemon = StartTwoModelDaemon(absl::StrCat(kKeeperTimeout));
  ASSERT_TRUE(daemon);
  ASSERT_EQ(client_->Load("m", "", {}), absl::OkStatus());
  WaitInStep();
  keeper->Kill(SIGSTOP);
  double slowest = 0;
  int calls = 0;
  auto timed = [&](const char* what, auto&& call) {
    const auto t0 = std::chrono::steady_clock::now();
    call();
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    slowest = std::max(slowest, secs);
    ++calls;
    EXPECT_LT(secs, kKeeperTimeout / 2) << what;
  };
  for (int i = 0; i < 3; ++i) {
    timed("status", [&] { EXPECT_TRUE(client_->Status().ok()); });
    timed("acquire", [&] {
      client::AcquireOptions o;
      o.model = "m";
      auto lease = client_->Acquire(o);
      EXPECT_TRUE(lease.ok()) << lease.status();
    });
  }
  auto admin = testing::AdminClient(socket_dir());
  ASSERT_TRUE(admin);
  timed("evict", [&] { EXPECT_EQ(admin->Evict("m", "").value_or(0), 1u); });
  timed("load", [&] { EXPECT_EQ(client_->Load("m2", "", {}), absl::OkStatus()); });
  timed("publish", [&] {  // a commit waits for its entry to turn ready: not for the keeper
    Process publisher(
        {PUBLISH_CLIENT_PATH, socket_dir() + "/control.sock", "m", "scaled-v1", "7", "commit"},
        dir_ / "publisher.log");
    EXPECT_TRUE(publisher.WaitFor("COMMITTED", 20s).has_value())
        << testing::ReadFileOrEmpty(dir_ / "publisher.log");
    publisher.CloseStdin();
    publisher.Wait();
  });
  for (int i = 0; i < 3; ++i) {
    timed("status after", [&] { EXPECT_TRUE(client_->Status().ok()); });
  }
  auto frozen = client_->Status();
  ASSERT_TRUE(frozen.ok());
  EXPECT_GT(frozen->keeper().pending_entries(), 0u) << "the link still waits on the keeper";
  std::printf("keeper frozen: %d calls, the slowest took %.3f s\n", calls, slowest);

  keeper->Kill(SIGCONT);
  auto st = WaitInStep(30s);
  for (const auto& e : st.entries()) {
    EXPECT_FALSE(e.model() == "m" && e.source() == "disk") << "m was evicted";
  }
  ASSERT_NE(Entry(st, "m2"), nullptr);
  EXPECT_EQ(KeeperStats().substr(0, 10), "entries=2 ") << "the keeper holds m2 and the published";

  keeper->Kill(SIGSTOP);  // and a SIGTERM while it is frozen, with the link waiting on it
  ASSERT_EQ(admin->Evict("m2", "").value_or(0), 1u);
  const auto t0 = std::chrono::steady_clock::now();
  daemon->Kill(SIGTERM);
  const int status = daemon->Wait();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 10s);  // the default --shutdown_timeout
  EXPECT_THAT(testing::ReadFileOrEmpty(dir_ / "daemon.log"),
              ::testing::Not(::testing::HasSubstr("longer than --shutdown_timeout")));
  keeper->Kill(SIGCONT);
}

// A keeper frozen past --keeper_timeout is given up: Status says it is down (with why), the
// daemon serves on while the link keeps trying, and once the keeper runs again the link
// connects again and reconciles (the entry evicted meanwhile dropped, the one loaded
// meanwhile deposited).
TEST_F(KeeperTest, AKeeperFrozenPastTheTimeoutIsGivenUpAndConnectedAgain) {
  auto keeper = StartKeeper();
  auto daemon = StartTwoModelDaemon("0.5");
  ASSERT_TRUE(daemon);
  ASSERT_EQ(client_->Load("m", "", {}), absl::OkStatus());
  WaitInStep();
  keeper->Kill(SIGSTOP);
  auto admin = testing::AdminClient(socket_dir());
  ASSERT_TRUE(admin);
  EXPECT_EQ(admin->Evict("m", "").value_or(0), 1u);  // a message the keeper never answers
  auto lost = testing::WaitForStatus(
      *client_, [](const v1::StatusResponse& s) { return !s.keeper().up(); }, 20s);
  EXPECT_FALSE(lost.keeper().up()) << lost.keeper().DebugString() << "\n"
                                   << testing::ReadFileOrEmpty(dir_ / "daemon.log");
  EXPECT_FALSE(lost.keeper().last_error().empty());
  // Serving on while the link connects again and again to the frozen keeper (each try
  // ends at the timeout).
  EXPECT_EQ(client_->Load("m2", "", {}), absl::OkStatus());
  const auto until = std::chrono::steady_clock::now() + 4 * 500ms;
  while (std::chrono::steady_clock::now() < until) {
    EXPECT_TRUE(client_->Status().ok());
    std::this_thread::sleep_for(50ms);  // a client's pace, not a poll for a condition
  }

  keeper->Kill(SIGCONT);
  auto st = WaitInStep(30s);
  ASSERT_NE(Entry(st, "m2"), nullptr);
  EXPECT_EQ(KeeperStats().substr(0, 10), "entries=1 ")
      << "the keeper holds m2 only\n"
      << testing::ReadFileOrEmpty(dir_ / "keeper.log");
  EXPECT_THAT(testing::ReadFileOrEmpty(dir_ / "daemon.log"),
              ::testing::HasSubstr("keeper: connected on " + keeper_sock() + " again"));
}

// A second daemon on the same keeper (started for debugging with another socket dir and the
// default keeper socket, here on other devices so it can adopt nothing) neither adopts nor
// drops the first one's entries: the keeper serves one daemon at a time. It serves from
// disk meanwhile; once the first daemon is gone it takes the keeper over and reconciles
// (drops what it does not hold, deposits its own).
TEST_F(KeeperTest, ASecondDaemonNeitherAdoptsNorDropsTheFirstOnesEntries) {
  auto keeper = StartKeeper();
  auto first = StartDaemon();
  ASSERT_TRUE(first);
  const std::string held = KeeperStats();
  ASSERT_EQ(held.substr(0, 10), "entries=1 ");
  const std::string second_dir = dir_ / "s2";
  auto second = testing::StartDaemon(
      {WEIGHTCACHED_PATH, "--socket_dir=" + second_dir, "--backend=host", "--metrics_address=off",
       "--keeper_socket=" + keeper_sock(), "--model=name=m,model_dir=" + dir_ / "m",
       "--host_devices=other", "--shutdown_timeout=1"},
      second_dir, dir_ / "second.log", [](const v1::StatusResponse& st) {
        const auto* e = Entry(st, "m");
        return e != nullptr && e->state() == "ready";
      });
  ASSERT_TRUE(second.ok()) << second.status() << testing::ReadFileOrEmpty(dir_ / "second.log");
  auto st = second->client->Status();
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(Entry(*st, "m")->source(), "disk");
  EXPECT_FALSE(st->keeper().up());
  EXPECT_THAT(st->keeper().last_error(),
              ::testing::HasSubstr("it serves the daemon pid " + std::to_string(first->pid())));
  EXPECT_EQ(st->keeper().dropped_entries(), 0u);
  EXPECT_EQ(KeeperStats(), held) << "the second daemon changed the first one's keeper";
  // The first one goes on with its keeper: a restart adopts its entry.
  first->Kill(SIGKILL);
  first->Wait();
  client_.reset();
  // ... unless the second takes the keeper over first: it asks every 2 s. Whichever owns
  // it, the keeper holds exactly its owner's entries.
  auto taken = testing::WaitForStatus(
      *second->client,
      [](const v1::StatusResponse& s) {
        return s.keeper().up() && s.keeper().pending_entries() == 0;
      },
      20s);
  EXPECT_TRUE(taken.keeper().up());
  EXPECT_EQ(KeeperStats().substr(0, 10), "entries=1 ");
  second->process->Kill(SIGTERM);
  EXPECT_EQ(second->process->Wait(), 0);
}

}  // namespace
}  // namespace weightcache
