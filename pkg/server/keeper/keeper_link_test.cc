// The keeper link against a real keeper (in this process) and a real registry: what it
// deposits when a load's thread is slow to turn its entry ready.
#include "pkg/server/keeper/keeper_link.h"

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "pkg/cache/registry.h"
#include "pkg/integrity/crypto_digest.h"
#include "pkg/integrity/segment_digest.h"
#include "pkg/keeper/server.h"
#include "pkg/memory/backend.h"
#include "tests/testutil/temp_dir.h"

namespace weightcache::server {
namespace {

using std::chrono::milliseconds;

// Passes the registry's notices on to the link, then holds the load's thread, as a busy
// node's scheduler may, between BeforeReady and the entry turning ready.
class SlowToReady final : public cache::EntryObserver {
 public:
  SlowToReady(KeeperLink* link, milliseconds hold) : link_(link), hold_(hold) {}
  void BeforeReady(const cache::Entry& e, const load::LoadedModel& content) override {
    link_->BeforeReady(e, content);
    std::this_thread::sleep_for(hold_);
  }
  void Evicted(const cache::Entry& e) override { link_->Evicted(e); }

 private:
  KeeperLink* link_;
  milliseconds hold_;
};

cache::LoadRequest OneSegmentLoad(memory::Backend* backend) {
  spec::FingerprintInputs in;
  in.architecture = "LlamaForCausalLM";
  in.files.push_back({"model.safetensors", 8192, "sha256:abc"});
  in.layout = {2, 1, 1, 0};
  in.dtype = "bf16";
  cache::LoadRequest req;
  req.key = {in.Digest(), "host"};
  req.model = "m";
  req.inputs = in;
  req.bytes = 1 << 20;
  req.load = [backend](cache::Entry&) -> absl::StatusOr<std::unique_ptr<load::LoadedModel>> {
    auto out = std::make_unique<load::LoadedModel>();
    auto seg = backend->Allocate("", 1 << 20, "keeper link test");
    if (!seg.ok()) return seg.status();
    out->segments.push_back(std::move(seg).value());
    out->device_uuid = "host";
    out->plan.segment_bytes = {1 << 20};
    out->plan.total_bytes = 1 << 20;
    return out;
  };
  return req;
}

v1::KeeperStatus StatusOf(const KeeperLink& link) {
  v1::KeeperStatus st;
  link.Fill(&st);
  return st;
}

// Polls `done` until it holds or 30 s pass (a condition, with a deadline for a hung run).
void Eventually(const std::function<bool()>& done) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (std::chrono::steady_clock::now() < deadline && !done()) {
    std::this_thread::sleep_for(milliseconds(5));
  }
}

// A real keeper in this process, on a socket in a temp dir, and host memory.
class KeeperLinkTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ko_.socket_path = dir_.path() + "/k/keeper.sock";
    auto k = keeper::Keeper::Start(ko_);
    ASSERT_TRUE(k.ok()) << k.status();
    keeper_ = std::move(k).value();
  }
  testing::TempDir dir_;
  keeper::KeeperOptions ko_;
  std::unique_ptr<keeper::Keeper> keeper_;
  std::unique_ptr<memory::Backend> backend_ = memory::MakeHostBackend();
};

// The load's thread held past io_timeout after BeforeReady: the link's mark for the entry
// stays pending until the entry is ready, and the entry is deposited. (Before, the mark was
// taken as done when the wait for ready timed out: the entry was never deposited, so a
// restart could not adopt it, and its eviction found nothing to drop, leaving a frozen
// keeper unnoticed: the busy-CI flake of keeper_integration_test.)
TEST_F(KeeperLinkTest, AnEntrySlowToTurnReadyIsStillDeposited) {
  cache::Registry registry;
  registry.SetDigester(
      [](const cache::Entry&,
         const load::LoadedModel& m) -> absl::StatusOr<std::vector<integrity::SegmentDigest>> {
        std::vector<integrity::SegmentDigest> out;
        for (const auto& s : m.segments) {
          out.push_back({{0}, integrity::CryptoDigestHost(s->host_data(), s->size())});
        }
        return out;
      });
  KeeperLink::Options o;
  o.socket_path = ko_.socket_path;
  o.retry = milliseconds(20);
  o.io_timeout = milliseconds(100);
  KeeperLink link(o, backend_.get(), &registry, nullptr, [](const std::string&) {
    return RecordedSpec{"name: m\n", true};
  });
  EXPECT_EQ(link.AdoptAll([](const v1::KeeperRecord&) { return absl::OkStatus(); }), 0u);
  SlowToReady slow(&link, 10 * o.io_timeout);
  registry.SetObserver(&slow);
  link.StartWatch();

  auto e = registry.StartOrJoin(OneSegmentLoad(backend_.get()));
  ASSERT_TRUE(e.ok()) << e.status();
  ASSERT_TRUE(
      registry.WaitReady(*e, std::chrono::steady_clock::now() + std::chrono::seconds(30)).ok());
  Eventually(
      [&] { return StatusOf(link).deposits() != 0 && StatusOf(link).pending_entries() == 0; });
  const v1::KeeperStatus st = StatusOf(link);
  EXPECT_EQ(st.deposits(), 1u) << st.DebugString();
  EXPECT_EQ(st.pending_entries(), 0u);
  EXPECT_EQ(keeper_->stats().entries, 1u);

  // Its eviction is a drop the keeper sees.
  EXPECT_EQ(registry.Evict((*e)->key, "test"), cache::Registry::Evicted::kGone);
  Eventually([&] { return keeper_->stats().entries == 0; });
  EXPECT_EQ(keeper_->stats().entries, 0u);
  link.Stop();
  registry.SetObserver(nullptr);
}

// The crypto digest of each segment (what the records carry), with a settable gate: while
// closed, every digest waits at it, as a large entry's digests take long.
class GatedDigester {
 public:
  cache::DigestFn Fn() {
    return [this](const cache::Entry&, const load::LoadedModel& m)
               -> absl::StatusOr<std::vector<integrity::SegmentDigest>> {
      {
        absl::MutexLock l(&mu_);
        waiting_++;
        mu_.Await(absl::Condition(&open_));
      }
      std::vector<integrity::SegmentDigest> out;
      for (const auto& s : m.segments) {
        auto d = integrity::DigestSegment(memory::BackendKind::kHost, *s, {},
                                          integrity::Want::kScrubAndCrypto);
        if (!d.ok()) return d.status();
        out.push_back(*std::move(d));
      }
      return out;
    };
  }
  void Open() {
    absl::MutexLock l(&mu_);
    open_ = true;
  }
  bool AwaitWaiting() {
    absl::MutexLock l(&mu_);
    return mu_.AwaitWithTimeout(absl::Condition(
                                    +[](int* n) { return *n > 0; }, &waiting_),
                                absl::Seconds(30));
  }

 private:
  absl::Mutex mu_;
  bool open_ ABSL_GUARDED_BY(mu_) = false;
  int waiting_ ABSL_GUARDED_BY(mu_) = 0;
};

// An adopted entry whose digests outlast AdoptAll's wait (here a wait of 1 ms against a
// digest held at a gate; before, a fixed 30 s against an entry of ~50 GB or more digested at
// 1.5-2 GB/s): the keeper keeps its copy, and when the digests end the entry is ready and
// known as the keeper's (its eviction drops it there). Before, the keeper was told to drop
// it while the registry went on to fill it and record it as held by the keeper.
TEST_F(KeeperLinkTest, AdoptionNeverDropsTheKeepersCopyOfAnEntryStillBeingDigested) {
  KeeperLink::Options o;
  o.socket_path = ko_.socket_path;
  o.retry = milliseconds(20);
  auto spec_of = [](const std::string&) { return RecordedSpec{"name: m\n", true}; };
  auto admit_all = [](const v1::KeeperRecord&) { return absl::OkStatus(); };
  GatedDigester first_digests;
  first_digests.Open();
  cache::Key key;
  {  // The daemon before: loads and deposits one entry, then stops (the keeper keeps it).
    cache::Registry registry;
    registry.SetDigester(first_digests.Fn());
    KeeperLink link(o, backend_.get(), &registry, nullptr, spec_of);
    EXPECT_EQ(link.AdoptAll(admit_all), 0u);
    registry.SetObserver(&link);
    link.StartWatch();
    cache::LoadRequest req = OneSegmentLoad(backend_.get());
    req.load = [load = std::move(req.load)](
                   cache::Entry& e) -> absl::StatusOr<std::unique_ptr<load::LoadedModel>> {
      auto m = load(e);  // sealed, as every load leaves its segments (adoption checks it)
      if (m.ok()) {
        for (auto& s : (*m)->segments) EXPECT_TRUE(s->Seal().ok());
      }
      return m;
    };
    auto e = registry.StartOrJoin(std::move(req));
    ASSERT_TRUE(e.ok()) << e.status();
    key = (*e)->key;
    Eventually([&] { return keeper_->stats().entries == 1; });
    ASSERT_EQ(keeper_->stats().entries, 1u);
    link.Stop();
    registry.SetObserver(nullptr);
  }
  // The daemon after: its digests wait at the gate past the adoption's bound.
  GatedDigester digests;
  cache::Registry registry;
  registry.SetDigester(digests.Fn());
  o.adoption_wait = milliseconds(1);
  o.adoption_digest_rate = 1e18;
  KeeperLink link(o, backend_.get(), &registry, nullptr, spec_of);
  registry.SetObserver(&link);
  EXPECT_EQ(link.AdoptAll(admit_all), 0u);  // not adopted yet: still being digested
  ASSERT_TRUE(digests.AwaitWaiting()) << "the adopted entry's digests never started";
  EXPECT_EQ(keeper_->stats().entries, 1u) << "the keeper was told to drop its copy";
  EXPECT_EQ(StatusOf(link).dropped_entries(), 0u);
  link.StartWatch();
  digests.Open();
  auto e = registry.Find(key);
  ASSERT_NE(e, nullptr);
  ASSERT_TRUE(
      registry.WaitReady(e, std::chrono::steady_clock::now() + std::chrono::seconds(30)).ok());
  EXPECT_EQ(e->source, "keeper");
  Eventually([&] { return StatusOf(link).pending_entries() == 0; });
  EXPECT_EQ(StatusOf(link).pending_entries(), 0u);
  EXPECT_EQ(StatusOf(link).adopted_entries(), 1u);
  EXPECT_EQ(keeper_->stats().entries, 1u);
  // Known as the keeper's: its eviction drops it there.
  EXPECT_EQ(registry.Evict(key, "test"), cache::Registry::Evicted::kGone);
  Eventually([&] { return keeper_->stats().entries == 0; });
  EXPECT_EQ(keeper_->stats().entries, 0u);
  link.Stop();
  registry.SetObserver(nullptr);
}

}  // namespace
}  // namespace weightcache::server
