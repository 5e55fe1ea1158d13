// Integrity in process (issue 27): the host backend's sealed memfds cannot change, so a test
// hook alters a digest the scrubber takes (DaemonHooks::BeforeDigestCompare, through
// pkg/server/testing/hooks.h); everything after it -- the entry out of service, the lease holder's
// event, the clean copy, the metrics, VerifyResident -- is the daemon's real path.
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <set>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "pkg/client/client.h"
#include "pkg/keeper/server.h"
#include "pkg/memory/backend.h"
#include "pkg/metrics/metrics.h"
#include "pkg/safetensors/writer.h"
#include "pkg/server/daemon.h"
#include "pkg/server/testing/in_process_daemon.h"
#include "prometheus/registry.h"
#include "weightcache/v1/weightcache.pb.h"

namespace weightcache::server {
namespace {

using namespace std::chrono_literals;
using ::testing::HasSubstr;

class IntegrityTest : public testing::DaemonInProcessTest {
 protected:
  safetensors::LlamaShape CheckpointShape() const override {
    safetensors::LlamaShape s;
    s.layers = 2;
    s.hidden = 512;
    s.intermediate = 1024;
    s.vocab = 1024;  // a few MiB: several 1 MiB chunks per segment
    return s;
  }
  void SetUp() override {
    DaemonInProcessTest::SetUp();
    metrics_ =
        std::make_unique<metrics::Metrics>(registry_, metrics::BuildInfo{"t", "none", "host"});
  }
  void Start(std::chrono::milliseconds scrub_interval, std::vector<spec::ModelSpec> more = {},
             std::string keeper_socket = "") {
    DaemonOptions o;
    o.specs = std::move(more);
    o.keeper_socket = std::move(keeper_socket);
    o.metrics = metrics_.get();
    o.scrub_interval = scrub_interval;
    o.scrub_bytes_per_second = 0;
    // One digest of segment 0 changes in its third chunk, once, when the test says so.
    hooks_.before_digest_compare = [this](const std::string& model, size_t segment,
                                          std::vector<uint64_t>* chunks) {
      if (segment == 0) {
        std::lock_guard<std::mutex> l(seen_mu_);
        seen_.push_back({std::chrono::steady_clock::now(), model});
      }
      if (model == "m" && segment == 0 && chunks->size() > 2 && corrupt_next_.exchange(false)) {
        (*chunks)[2] ^= 1;
      }
    };
    DaemonInProcessTest::Start(std::move(o));
  }
  std::unique_ptr<client::Lease> Acquire() {
    auto l = DaemonInProcessTest::Acquire();
    EXPECT_TRUE(l.ok()) << l.status();
    return l.ok() ? std::move(l).value() : nullptr;
  }
  double Counter(const std::string& name, const std::string& model = "") {
    for (const auto& f : registry_.Collect()) {
      if (f.name != name) continue;
      for (const auto& m : f.metric) {
        bool match = model.empty();
        for (const auto& l : m.label) match = match || (l.name == "model" && l.value == model);
        if (match) return m.counter.value;
      }
    }
    return -1;
  }
  std::vector<v1::EntryInfo> Entries() {
    auto st = client_->Status();
    EXPECT_TRUE(st.ok()) << st.status();
    return st.ok() ? std::vector<v1::EntryInfo>(st->entries().begin(), st->entries().end())
                   : std::vector<v1::EntryInfo>{};
  }
  // The daemon uses the metrics and the hook's flag: it goes before they do.
  void TearDown() override {
    client_.reset();
    daemon_.reset();
  }

  prometheus::Registry registry_;
  std::unique_ptr<metrics::Metrics> metrics_;
  std::atomic<bool> corrupt_next_{false};
  // Every scrub digest of a segment 0: when, and of which model.
  struct Seen {
    std::chrono::steady_clock::time_point at;
    std::string model;
  };
  std::mutex seen_mu_;
  std::vector<Seen> seen_;
};

// Issue 48: passes start at a random point of each interval and visit the entries in a random
// order, so an engine cannot time a write and its undoing between them. They used to start
// every interval exactly, in the registry's order.
TEST_F(IntegrityTest, PassesComeAtRandomTimesInARandomOrder) {
  constexpr auto kInterval = 100ms;
  ASSERT_TRUE(safetensors::WriteLlamaCheckpoint(dir_ / "m2", testing::SmallLlama()).ok());
  spec::ModelSpec m2;
  m2.name = "m2";
  m2.model_dir = dir_ / "m2";
  Start(kInterval, {m2});
  client::AcquireOptions o;
  o.wait_ready = true;
  std::vector<std::unique_ptr<client::Lease>> held;
  for (const char* model : {"m", "m2"}) {  // two entries
    o.model = model;
    auto l = client_->Acquire(o);
    ASSERT_TRUE(l.ok()) << l.status();
    held.push_back(std::move(l).value());
  }
  {
    std::lock_guard<std::mutex> l(seen_mu_);
    seen_.clear();  // from here on, every pass digests both
  }
  // A pass: the two models' digests back to back (milliseconds apart; passes are about an
  // interval apart). Pairs split by a stall of the machine are left out, not misread.
  struct Pass {
    double start;
    std::string first;
  };
  constexpr size_t kPasses = 24;
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<Pass> passes;
  while (passes.size() < kPasses && std::chrono::steady_clock::now() - t0 < 60s) {
    std::this_thread::sleep_for(20ms);
    std::lock_guard<std::mutex> l(seen_mu_);
    passes.clear();
    for (size_t i = 0; i + 1 < seen_.size(); ++i) {
      if (seen_[i].model != seen_[i + 1].model && seen_[i + 1].at - seen_[i].at < kInterval / 4) {
        passes.push_back({std::chrono::duration<double>(seen_[i].at - t0).count(), seen_[i].model});
        ++i;
      }
    }
  }
  ASSERT_GE(passes.size(), kPasses);
  std::set<std::string> led;
  std::vector<double> starts;
  for (const auto& p : passes) {
    led.insert(p.first);
    starts.push_back(p.start);
  }
  EXPECT_EQ(led.size(), 2u) << "every pass visited the same entry first";
  // Passes at fixed times are at least an interval apart (the next starts an interval after
  // the last began; a busy machine only delays it). At random points of their windows, two
  // starts are closer than 0.9 interval with probability about 0.4 each, so over 20 gaps
  // (independent but for shared windows) at least one is, but for about 3e-5.
  double shortest = 1e9;
  for (size_t j = 1; j < starts.size(); ++j)
    shortest = std::min(shortest, starts[j] - starts[j - 1]);
  EXPECT_LT(shortest, 0.9 * std::chrono::duration<double>(kInterval).count())
      << "every pass began at least an interval after the one before";
}

// The scrubber finds the change: the entry leaves service (state corrupt, naming segment and
// bytes), the lease holder's Check() says so, a clean copy serves new Acquires with the same
// bytes, and the corrupt one goes with its last lease.
TEST_F(IntegrityTest, ACorruptEntryLeavesServiceItsHolderIsToldAndACleanCopyServes) {
  Start(50ms);
  auto held = Acquire();
  ASSERT_NE(held, nullptr);
  ASSERT_GT(held->segment_size(0), 3u << 20);
  EXPECT_TRUE(held->Check().ok());
  // A pass ran clean before the change: the entry is verified recently.
  const auto t0 = std::chrono::steady_clock::now();
  while (Counter("weightcache_integrity_checks_total") < 1 &&
         std::chrono::steady_clock::now() - t0 < 30s) {
    std::this_thread::sleep_for(10ms);
  }
  ASSERT_GE(Counter("weightcache_integrity_checks_total"), 1);
  ASSERT_EQ(Entries().size(), 1u);
  EXPECT_GE(Entries()[0].verified_seconds_ago(), 0);

  corrupt_next_ = true;
  absl::Status told = held->Check(30s);  // waits for the event
  ASSERT_EQ(told.code(), absl::StatusCode::kDataLoss) << told;
  EXPECT_THAT(std::string(told.message()),
              HasSubstr("segment 0 of " + std::to_string(held->segment_count())));
  EXPECT_THAT(std::string(told.message()), HasSubstr("bytes [2097152, 3145728) changed"));
  EXPECT_EQ(held->Check().code(), absl::StatusCode::kDataLoss);  // and stays so
  EXPECT_EQ(Counter("weightcache_integrity_failures_total", "m"), 1);

  // A clean copy is loaded for new Acquires; the corrupt entry stays listed while held.
  // Asked right after the event: the Acquire waits for the reload, never a miss.
  std::unique_ptr<client::Lease> fresh = Acquire();
  ASSERT_NE(fresh, nullptr);
  EXPECT_TRUE(fresh->Check().ok());
  EXPECT_EQ(fresh->fingerprint(), held->fingerprint());
  EXPECT_NE(fresh->segment_base(0), held->segment_base(0));  // another mapping of other memory
  for (const auto& t : fresh->tensors()) {
    const client::TensorView* old = held->Find(t.name);
    ASSERT_NE(old, nullptr) << t.name;
    ASSERT_EQ(std::memcmp(t.data, old->data, t.nbytes), 0) << t.name;  // the change was the hook's
  }
  auto entries = Entries();
  ASSERT_EQ(entries.size(), 2u);
  int corrupt = 0, ready = 0;
  for (const auto& e : entries) {
    if (e.state() == "corrupt") {
      ++corrupt;
      EXPECT_THAT(e.error(), HasSubstr("segment 0"));
      EXPECT_EQ(e.leases_size(), 1);
      EXPECT_EQ(e.leases(0).lease_id(), held->id());
    }
    if (e.state() == "ready") ++ready;
  }
  EXPECT_EQ(corrupt, 1);
  EXPECT_EQ(ready, 1);
  held.reset();  // its last lease ends: the corrupt memory goes
  for (auto t = std::chrono::steady_clock::now();
       Entries().size() != 1 && std::chrono::steady_clock::now() - t < 30s;) {
    std::this_thread::sleep_for(10ms);
  }
  entries = Entries();
  ASSERT_EQ(entries.size(), 1u);
  EXPECT_EQ(entries[0].state(), "ready");
}

// Issue 48: once the daemon is gone, Check() says so (UNAVAILABLE, "unknown: the daemon
// connection is gone") on every call; it used to answer OK forever after the handle connection
// closed, so an engine polled "clean" on weights nobody watched. A corrupt verdict read before
// the daemon went stays DATA_LOSS.
TEST_F(IntegrityTest, CheckAfterTheDaemonWentIsNeverClean) {
  Start(0ms);
  auto quiet = Acquire();
  auto told = Acquire();
  ASSERT_NE(quiet, nullptr);
  ASSERT_NE(told, nullptr);
  ASSERT_TRUE(quiet->Check().ok());
  corrupt_next_ = true;
  ASSERT_TRUE(client_->VerifyResident("m").ok());
  ASSERT_EQ(told->Check(10s).code(), absl::StatusCode::kDataLoss);
  // `quiet` was told as well (same entry): acquire a fresh, clean lease to stand for an engine
  // that was told nothing.
  auto fresh = Acquire();
  ASSERT_NE(fresh, nullptr);
  ASSERT_TRUE(fresh->Check().ok());

  client_.reset();
  daemon_.reset();               // the daemon ends: every handle connection closes
  for (int i = 0; i < 2; ++i) {  // the first call reads the close, the second remembers it
    // (0 s the second time: a call that begins unattached waits for a daemon to be back.)
    const absl::Status gone = fresh->Check(i == 0 ? 10s : 0s);
    EXPECT_EQ(gone.code(), absl::StatusCode::kUnavailable) << gone;
    EXPECT_THAT(std::string(gone.message()), HasSubstr("unknown: the daemon connection is gone"));
    EXPECT_THAT(std::string(gone.message()), HasSubstr(fresh->id()));
  }
  EXPECT_EQ(told->Check(10s).code(), absl::StatusCode::kDataLoss);  // the worse news stays
  EXPECT_NE(fresh->Find(fresh->tensors()[0].name), nullptr);        // still mapped
}

// Issue 60: a daemon restart is not an engine failure. The keeper keeps the memory; once the
// daemon is back and has adopted it, the lease re-attaches (same content_id, nothing mapped
// again): the new daemon lists it, and a corruption it finds after the restart reaches it.
// Before, Check answered UNAVAILABLE "unknown" for good after every restart.
TEST_F(IntegrityTest, ALeaseReattachesToTheMemoryTheKeeperKeptAcrossARestart) {
  auto keeper = keeper::Keeper::Start({.socket_path = dir_ / "k/keeper.sock"});
  ASSERT_TRUE(keeper.ok()) << keeper.status();
  Start(0ms, {}, (*keeper)->path());
  auto lease = Acquire();
  ASSERT_NE(lease, nullptr);
  ASSERT_FALSE(lease->content_id().empty());
  const std::string first_id = lease->id();
  EXPECT_EQ(lease->Watch().state, client::LeaseState::kClean);
  // The keeper holds it once the link deposited it (after readiness, on the link's thread).
  for (auto deadline = std::chrono::steady_clock::now() + 30s;
       (*keeper)->stats().entries < 1 && std::chrono::steady_clock::now() < deadline;) {
    lease->Check(10ms);  // a bounded wait between looks
  }
  ASSERT_EQ((*keeper)->stats().entries, 1u);

  client_.reset();
  daemon_.reset();  // every handle connection closes; the keeper keeps the memory
  const client::LeaseWatch gone = lease->Watch(10s);
  EXPECT_EQ(gone.state, client::LeaseState::kUnknown);
  EXPECT_THAT(gone.message, HasSubstr("the daemon connection is gone"));

  Start(0ms, {}, (*keeper)->path());  // adopts the kept entry before it serves
  // Re-attaching is tried at most once a second: within a few of them it is clean again.
  client::LeaseWatch back;
  for (auto deadline = std::chrono::steady_clock::now() + 30s;
       (back = lease->Watch(100ms)).state != client::LeaseState::kClean &&
       std::chrono::steady_clock::now() < deadline;) {
  }
  ASSERT_EQ(back.state, client::LeaseState::kClean) << back.message;
  EXPECT_TRUE(lease->Check().ok());
  auto entries = Entries();
  ASSERT_EQ(entries.size(), 1u);
  EXPECT_EQ(entries[0].source(), "keeper");  // the same memory, not a load
  ASSERT_EQ(entries[0].leases_size(), 1);    // the new daemon counts the lease
  EXPECT_EQ(entries[0].leases(0).pid(), ::getpid());
  EXPECT_NE(entries[0].leases(0).lease_id(), first_id);

  corrupt_next_ = true;
  ASSERT_TRUE(client_->VerifyResident("m").ok());
  const client::LeaseWatch told = lease->Watch(10s);
  EXPECT_EQ(told.state, client::LeaseState::kCorrupt);
  EXPECT_THAT(told.message, HasSubstr("changed"));
  EXPECT_EQ(lease->Check().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(lease->Find(lease->tensors()[0].name), nullptr);  // mapped throughout
}

// Without a keeper the daemon that is back loads another copy of the same fingerprint:
// watching it would say nothing of the memory this process maps, so the lease stays unknown,
// saying so, and ends the lease it was offered.
TEST_F(IntegrityTest, ALeaseNeverReattachesToAnotherCopy) {
  Start(0ms);
  auto lease = Acquire();
  ASSERT_NE(lease, nullptr);
  client_.reset();
  daemon_.reset();
  Start(0ms);
  auto fresh = Acquire();  // the copy the new daemon loaded: ready
  ASSERT_NE(fresh, nullptr);
  EXPECT_EQ(fresh->fingerprint(), lease->fingerprint());
  EXPECT_NE(fresh->content_id(), lease->content_id());
  const client::LeaseWatch w = lease->Watch(100ms);  // the close and the one re-attach try
  EXPECT_EQ(w.state, client::LeaseState::kUnknown);
  EXPECT_THAT(w.message, HasSubstr("serves another copy of fingerprint " + lease->fingerprint()));
  auto entries = Entries();
  ASSERT_EQ(entries.size(), 1u);
  EXPECT_EQ(entries[0].leases_size(), 1);  // `fresh` only: the offered lease was released
  EXPECT_EQ(lease->Watch().state, client::LeaseState::kUnknown);  // for good
}

// Issue 48: an entry evicted while a lease maps it (draining) is still scrubbed, and its
// holder is told when it changes. The scrubber used to visit ready entries only, so an engine
// computing with an evicted entry was never told.
TEST_F(IntegrityTest, ADrainingEntryIsStillScrubbedAndItsHolderTold) {
  Start(50ms);
  auto held = Acquire();
  ASSERT_NE(held, nullptr);
  auto evicted = client_->Evict("m", "");
  ASSERT_TRUE(evicted.ok()) << evicted.status();
  auto entries = Entries();
  ASSERT_EQ(entries.size(), 1u);
  ASSERT_EQ(entries[0].state(), "draining");

  corrupt_next_ = true;
  const absl::Status told = held->Check(30s);
  ASSERT_EQ(told.code(), absl::StatusCode::kDataLoss) << told;
  EXPECT_THAT(std::string(told.message()), HasSubstr("bytes [2097152, 3145728) changed"));
  EXPECT_EQ(Counter("weightcache_integrity_failures_total", "m"), 1);
  // Recorded for admins; not reloaded (it had been evicted: nothing served it).
  auto st = client_->Status();
  ASSERT_TRUE(st.ok()) << st.status();
  ASSERT_EQ(st->integrity_findings_size(), 1);
  EXPECT_EQ(st->integrity_findings(0).was(), "draining");
  EXPECT_EQ(st->integrity_findings(0).leases_told(), 1u);
  EXPECT_THAT(st->integrity_findings(0).reload(), HasSubstr("none: it was evicted"));
}

// VerifyResident checks at once, in the daemon: clean, then corrupt with the same detail the
// scrubber logs; the corrupt entry is out of service (the next answer is about the copy).
TEST_F(IntegrityTest, VerifyResidentChecksNowAndFindsTheChange) {
  Start(0ms);  // no scrubber thread: only VerifyResident checks
  auto held = Acquire();
  ASSERT_NE(held, nullptr);
  auto clean = client_->VerifyResident("m");
  ASSERT_TRUE(clean.ok()) << clean.status();
  ASSERT_EQ(clean->entries_size(), 1);
  EXPECT_EQ(clean->entries(0).result(), "clean");
  EXPECT_EQ(clean->entries(0).segments(), held->segment_count());
  EXPECT_GT(clean->entries(0).bytes(), 0u);
  EXPECT_EQ(Counter("weightcache_integrity_checks_total"), 1);

  corrupt_next_ = true;
  auto found = client_->VerifyResident("m");
  ASSERT_TRUE(found.ok()) << found.status();
  ASSERT_EQ(found->entries_size(), 1);
  EXPECT_EQ(found->entries(0).result(), "corrupt");
  EXPECT_THAT(found->entries(0).detail(), HasSubstr("segment 0 of"));
  EXPECT_EQ(held->Check(10s).code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(Counter("weightcache_integrity_failures_total", "m"), 1);

  EXPECT_EQ(client_->VerifyResident("nope").status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace weightcache::server
