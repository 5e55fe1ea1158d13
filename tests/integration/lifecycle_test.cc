// Daemon lifecycle with real processes on the host backend (issue 13): SIGTERM at any
// moment (idle, during a load, during an Acquire waiting for it, during a peer copy) exits 0
// by itself (never through the --shutdown_timeout watchdog) and leaves no socket behind,
// repeated; a peer copy is cancelled within its chunk (issue 24); per-rank budgets for tp 2
// and 4.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <thread>

#include "bench/sparse_checkpoint.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "pkg/client/client.h"
#include "pkg/memory/backend.h"
#include "pkg/safetensors/writer.h"
#include "tests/integration/daemon_harness.h"
#include "tests/integration/process.h"
#include "tests/testutil/temp_dir.h"
#include "weightcache/v1/weightcache.pb.h"

namespace weightcache {
namespace {

using namespace std::chrono_literals;
using testing::Process;
using testing::TempDir;

// Large enough (sparse: zeros, no disk) that its load and its peer copy take a while.
constexpr uint64_t kBigBytes = 512ull << 20;
// Rounds per scenario: 6, and 3 for the peer copy (each of its rounds copies 1 GiB: more would
// not fit ctest's timeout on a slow machine); 21 SIGTERMs per run.
constexpr int kRounds = 6;
constexpr int kPeerCopyRounds = 3;
// The daemon's default --shutdown_timeout: past it the watchdog ends the process (still
// exit 0, so the test also looks for the watchdog's log line).
constexpr double kShutdownTimeout = 10.0;

// The number of seconds that follows the last `after` in a daemon log ("... 1.571 s"); -1
// when there is none.
double LoggedSeconds(const std::string& log, const std::string& after) {
  const size_t at = log.rfind(after);
  if (at == std::string::npos) return -1;
  return std::strtod(log.c_str() + at + after.size(), nullptr);
}

class LifecycleTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    bench::WriteSparseCheckpoint(*dir_ / "big", 64, kBigBytes);
  }
  static void TearDownTestSuite() { delete dir_; }

  std::unique_ptr<Process> Start(const std::vector<std::string>& extra) {
    std::vector<std::string> argv{WEIGHTCACHED_PATH, "--socket_dir=" + socket_dir(),
                                  "--backend=host", "--metrics_address=off",
                                  "--model=name=big,model_dir=" + *dir_ / "big"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    auto d = testing::StartDaemon(argv, socket_dir(), *dir_ / "daemon.log");
    EXPECT_TRUE(d.ok()) << d.status();
    if (!d.ok()) return nullptr;
    client_ = std::move(d->client);
    return std::move(d->process);
  }

  // SIGTERM, then: exit status 0 by the daemon's own teardown (not the watchdog), and
  // neither socket left. Returns the seconds from the signal to the exit.
  double TermAndCheck(Process* p, const std::string& scenario) {
    auto t0 = std::chrono::steady_clock::now();
    p->Kill(SIGTERM);
    int status = p->Wait();
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    slowest_[scenario] = std::max(slowest_[scenario], secs);
    const std::string log = testing::ReadFileOrEmpty(*dir_ / "daemon.log");
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << scenario << ": wait status " << status << "\n"
        << log;
    EXPECT_LT(secs, kShutdownTimeout) << scenario << "\n" << log;
    EXPECT_EQ(log.find("longer than --shutdown_timeout"), std::string::npos) << scenario << "\n"
                                                                             << log;
    EXPECT_FALSE(std::filesystem::exists(socket_dir() + "/control.sock")) << scenario;
    EXPECT_FALSE(std::filesystem::exists(socket_dir() + "/handle.sock")) << scenario;
    return secs;
  }

  // Polls until an entry on `device` (any when empty) is loading with some bytes done (a
  // peer copy reports per chunk).
  bool WaitLoading(const std::string& device = "") {
    auto deadline = std::chrono::steady_clock::now() + 20s;
    while (std::chrono::steady_clock::now() < deadline) {
      auto st = client_->Status();
      if (st.ok()) {
        for (const auto& e : st->entries()) {
          if (e.state() == "loading" && e.bytes_done() > 0 &&
              (device.empty() || e.device_uuid() == device)) {
            return true;
          }
        }
      }
      std::this_thread::sleep_for(2ms);  // a bounded poll
    }
    return false;
  }

  std::string socket_dir() const { return *dir_ / "s"; }

  static TempDir* dir_;
  // Shared with the calls a scenario runs on other threads: the client outlives them.
  std::shared_ptr<client::Client> client_;
  std::map<std::string, double> slowest_;  // scenario -> longest SIGTERM-to-exit seconds
};

TempDir* LifecycleTest::dir_ = nullptr;

// One test per scenario, so each stays well inside ctest's timeout on a slow machine; every
// round prints a line as it ends, so a test stopped by that timeout shows where it was.
enum class Scenario { kIdle, kLoad, kAcquire, kPeerCopy };

class SigtermTest : public LifecycleTest, public ::testing::WithParamInterface<Scenario> {
 protected:
  void Round(int round);
  int mid_copy_stops_ = 0;  // peer-copy rounds whose copy the SIGTERM stopped mid-segment
};

// "stopped after N of M bytes" in the last such daemon log line: {N, M}; {-1, -1} when none.
std::pair<int64_t, int64_t> StoppedAfter(const std::string& log) {
  const std::string tag = "stopped after ";
  const size_t at = log.rfind(tag);
  if (at == std::string::npos) return {-1, -1};
  char* end = nullptr;
  const int64_t done = std::strtoll(log.c_str() + at + tag.size(), &end, 10);
  const size_t of = log.find(" of ", at);
  if (of == std::string::npos) return {-1, -1};
  return {done, std::strtoll(log.c_str() + of + 4, nullptr, 10)};
}

void SigtermTest::Round(int round) {
  switch (GetParam()) {
    case Scenario::kIdle: {  // a model ready
      auto d = Start({});
      ASSERT_TRUE(d);
      testing::WaitForStatus(
          *client_,
          [](const auto& s) { return s.entries_size() == 1 && s.entries(0).state() == "ready"; },
          20s);
      TermAndCheck(d.get(), "idle");
      break;
    }
    case Scenario::kLoad: {  // during a load
      auto d = Start({"--preload=false"});
      ASSERT_TRUE(d);
      auto load = std::async(std::launch::async, [c = client_] { return c->Load("big", "", {}); });
      ASSERT_TRUE(WaitLoading()) << "the load never showed progress";
      TermAndCheck(d.get(), "load");
      EXPECT_FALSE(load.get().ok());  // cancelled, not completed
      break;
    }
    case Scenario::kAcquire: {  // during an Acquire waiting for that load
      auto d = Start({"--preload=false"});
      ASSERT_TRUE(d);
      client::AcquireOptions o;
      o.model = "big";
      o.load_on_miss = true;
      auto acquire = std::async(std::launch::async, [c = client_, o] { return c->Acquire(o); });
      ASSERT_TRUE(WaitLoading());
      TermAndCheck(d.get(), "acquire");
      EXPECT_FALSE(acquire.get().ok());
      break;
    }
    case Scenario::kPeerCopy: {  // from host-a to host-c, after a whole one to host-b is timed
      auto d = Start({"--host_devices=host-a,host-b,host-c"});
      ASSERT_TRUE(d);
      testing::WaitForStatus(
          *client_,
          [](const auto& s) { return s.entries_size() == 1 && s.entries(0).state() == "ready"; },
          20s);
      client::AcquireOptions o;
      o.model = "big";
      o.device_uuid = "host-b";
      o.wait_ready = true;
      // The cancellation granularity on this machine now: one chunk's share of a whole copy,
      // as the daemon timed it (its "peer copy of ..." line).
      auto whole = client_->Acquire(o);
      ASSERT_TRUE(whole.ok()) << whole.status();
      const double copy_secs =
          LoggedSeconds(testing::ReadFileOrEmpty(*dir_ / "daemon.log"), "segments, ");
      ASSERT_GT(copy_secs, 0) << testing::ReadFileOrEmpty(*dir_ / "daemon.log");
      whole->reset();
      const double chunk_secs =
          copy_secs * static_cast<double>(memory::kCopyChunkBytes) / static_cast<double>(kBigBytes);
      o.device_uuid = "host-c";
      auto acquire = std::async(std::launch::async, [c = client_, o] { return c->Acquire(o); });
      ASSERT_TRUE(WaitLoading("host-c")) << "the peer copy never showed progress";
      TermAndCheck(d.get(), "peer copy");
      (void)acquire.get();  // may have finished in time; the daemon's exit is what counts
      // The cancelled copy stops at the chunk in flight: mid-segment (the copy is one
      // 512 MiB segment of 16 chunks). A copy cancelled only at its segment's end (the bug)
      // copies it whole. Judged in bytes, not seconds: on a shared machine a chunk's time
      // varies several-fold within one copy (measured here: 23 ms, then 115-175 ms), so no
      // bound in seconds both holds and tells the fix from the bug.
      const std::string log = testing::ReadFileOrEmpty(*dir_ / "daemon.log");
      const double joined = LoggedSeconds(log, "load threads joined in ");
      ASSERT_GE(joined, 0) << log;
      const auto [stopped, total] = StoppedAfter(log);
      std::printf(
          "peer copy round %d: whole copy %.3f s (a %llu MiB chunk %.3f s on average); the "
          "teardown waited %.3f s for the cancelled copy, stopped after %lld of %lld bytes\n",
          round, copy_secs, static_cast<unsigned long long>(memory::kCopyChunkBytes >> 20),
          chunk_secs, joined, static_cast<long long>(stopped), static_cast<long long>(total));
      if (stopped >= 0) {  // absent: the copy had finished before the signal
        EXPECT_LT(stopped, total) << log;
        EXPECT_EQ(stopped % static_cast<int64_t>(memory::kCopyChunkBytes), 0) << log;
        ++mid_copy_stops_;
      }
      break;
    }
  }
}

TEST_P(SigtermTest, ExitsZeroInTimeWithNoSocketLeft) {
  const int rounds = GetParam() == Scenario::kPeerCopy ? kPeerCopyRounds : kRounds;
  for (int round = 0; round < rounds; ++round) {
    Round(round);
    std::printf("round %d done\n", round);
    std::fflush(stdout);
    if (HasFatalFailure()) return;
  }
  if (GetParam() == Scenario::kPeerCopy) {
    EXPECT_GT(mid_copy_stops_, 0) << "no round's SIGTERM came while the copy ran: nothing judged";
  }
  for (const auto& [scenario, secs] : slowest_) {
    std::printf("SIGTERM %-10s slowest exit %.3f s over %d rounds\n", scenario.c_str(), secs,
                rounds);
  }
}

INSTANTIATE_TEST_SUITE_P(AtAnyMoment, SigtermTest,
                         ::testing::Values(Scenario::kIdle, Scenario::kLoad, Scenario::kAcquire,
                                           Scenario::kPeerCopy),
                         [](const ::testing::TestParamInfo<Scenario>& info) {
                           switch (info.param) {
                             case Scenario::kIdle:
                               return std::string("Idle");
                             case Scenario::kLoad:
                               return std::string("DuringALoad");
                             case Scenario::kAcquire:
                               return std::string("DuringAWaitingAcquire");
                             case Scenario::kPeerCopy:
                               return std::string("DuringAPeerCopy");
                           }
                           return std::string("Unknown");
                         });

// Each rank reserves its own planned bytes, not the whole checkpoint: a budget per device
// just above one shard holds a tp 2 and a tp 4 model, one rank per device.
TEST(BudgetTest, TensorParallelRanksFitABudgetJustAboveTheirShard) {
  TempDir dir;
  safetensors::LlamaShape shape;  // ~72 MiB of bf16
  shape.hidden = 1024;
  shape.intermediate = 2816;
  shape.heads = 8;
  shape.kv_heads = 4;
  shape.vocab = 8192;
  ASSERT_TRUE(safetensors::WriteLlamaCheckpoint(dir / "m", shape).ok());
  const uint64_t total = std::filesystem::file_size(dir / "m/model.safetensors");
  for (int tp : {2, 4}) {
    // A shard is about total / tp (norms are replicated: small); 4 MiB of slack for them and
    // the 2 MiB granule. Far below the whole checkpoint, which each rank reserved before.
    const uint64_t budget = total / tp + (4ull << 20);
    ASSERT_LT(budget, total);
    std::string devices;
    for (int d = 0; d < tp; ++d) devices += (d ? ",dev-" : "dev-") + std::to_string(d);
    const std::string socket_dir = dir / ("s" + std::to_string(tp));
    std::ofstream(dir / "spec.yaml", std::ios::trunc) << "name: m\nmodel_dir: " << dir / "m"
                                                      << "\ntp_size: " << tp << "\n";
    auto d = testing::StartDaemon(
        {WEIGHTCACHED_PATH, "--socket_dir=" + socket_dir, "--backend=host", "--metrics_address=off",
         "--host_devices=" + devices, "--spec_file=" + dir / "spec.yaml",
         "--memory_budget=" + std::to_string(budget)},
        socket_dir, dir / "daemon.log");
    ASSERT_TRUE(d.ok()) << d.status();
    auto st = testing::WaitForStatus(
        *d->client,
        [tp](const auto& s) {
          int ready = 0;
          for (const auto& e : s.entries()) ready += e.state() == "ready" ? 1 : 0;
          return ready == tp;
        },
        20s);
    for (const auto& e : st.entries()) {
      EXPECT_EQ(e.state(), "ready") << "tp " << tp << ": " << e.error();
      EXPECT_LE(e.bytes(), budget);
    }
    // Another rank's worth on a device whose rank is mapped (so not evictable) is refused,
    // naming the budget, and nothing is evicted.
    client::AcquireOptions o;
    o.model = "m";
    o.tp_size = tp;
    o.tp_rank = 0;
    o.device_uuid = "dev-0";
    auto held = d->client->Acquire(o);
    ASSERT_TRUE(held.ok()) << held.status();
    o.tp_rank = 1;
    o.wait_ready = true;
    auto copy = d->client->Acquire(o);
    EXPECT_EQ(copy.status().code(), absl::StatusCode::kResourceExhausted) << copy.status();
    EXPECT_THAT(std::string(copy.status().message()), ::testing::HasSubstr("budget"));
    d->process->Kill(SIGTERM);
    d->process->Wait();
  }
}

}  // namespace
}  // namespace weightcache
