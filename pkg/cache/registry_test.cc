#include "pkg/cache/registry.h"

#include <atomic>
#include <future>
#include <latch>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "pkg/memory/backend.h"

namespace weightcache::cache {
namespace {

using namespace std::chrono_literals;

auto Far() { return std::chrono::steady_clock::now() + 10s; }

Key K(const std::string& fp, const std::string& device = "host") { return {fp, device}; }

LoadRequest Req(const std::string& fp, const std::string& model, uint64_t bytes, LoadFn load,
                const std::string& device = "host", const std::string& source = "disk") {
  LoadRequest r;
  r.key = K(fp, device);
  r.model = model;
  r.bytes = bytes;
  r.source = source;
  r.load = std::move(load);
  return r;
}

// A lease of uid 0 held by `pid`; `claimed`: its descriptors were handed out.
LeaseRecord Lease(const std::string& id, int pid, bool claimed = false) {
  LeaseRecord l;
  l.id = id;
  l.pid = pid;
  l.claimed = claimed;
  return l;
}

// A load that produces one real host segment of `bytes`.
LoadFn SegmentLoad(uint64_t bytes, std::atomic<int>* calls = nullptr,
                   const std::shared_future<void>& gate = {}) {
  return [=](Entry&) -> absl::StatusOr<std::unique_ptr<load::LoadedModel>> {
    if (calls != nullptr) calls->fetch_add(1);
    if (gate.valid()) gate.wait();
    auto m = std::make_unique<load::LoadedModel>();
    auto seg = memory::MakeHostBackend()->Allocate("", bytes, "t");
    if (!seg.ok()) return seg.status();
    m->segments.push_back(std::move(seg).value());
    return m;
  };
}

TEST(Registry, ConcurrentRequestsShareOneLoad) {
  Registry r;
  std::atomic<int> calls{0};
  std::promise<void> open;
  std::shared_future<void> gate = open.get_future().share();
  std::vector<std::thread> threads;
  std::atomic<int> started{0}, ready{0};
  std::latch all_joined(32);
  for (int i = 0; i < 32; ++i) {
    threads.emplace_back([&] {
      bool s = false;
      auto e = r.StartOrJoin(Req("fp", "m", 0, SegmentLoad(4096, &calls, gate)), &s);
      ASSERT_TRUE(e.ok());
      if (s) started++;
      all_joined.count_down();
      if (r.WaitReady(*e, Far()).ok()) ready++;
    });
  }
  all_joined.wait();  // every caller has joined while the load is blocked
  open.set_value();
  for (auto& t : threads) t.join();
  EXPECT_EQ(calls.load(), 1);
  EXPECT_EQ(started.load(), 1);
  EXPECT_EQ(ready.load(), 32);
}

// A waiter whose caller left stops waiting at its next check, not at its deadline (issue 26).
TEST(Registry, AWaitEndsWhenItsCallerIsGone) {
  Registry r;
  std::promise<void> open;
  auto e = r.StartOrJoin(Req("fp", "m", 0, SegmentLoad(4096, nullptr, open.get_future().share())));
  ASSERT_TRUE(e.ok());
  std::atomic<bool> gone{false};
  std::thread leave([&] {
    std::this_thread::sleep_for(50ms);
    gone = true;
  });
  // CANCELLED, not DEADLINE_EXCEEDED: it ended because the caller left.
  absl::Status s = r.WaitReady(*e, Far(), [&] { return gone.load(); });
  leave.join();
  EXPECT_EQ(s.code(), absl::StatusCode::kCancelled) << s;
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("the caller went away"));
  open.set_value();
  EXPECT_TRUE(r.WaitReady(*e, Far(), [] { return false; }).ok());
}

TEST(Registry, FinishedLoadThreadsAreJoinedNotKept) {
  Registry r;
  constexpr int kLoads = 40;
  for (int i = 0; i < kLoads; ++i) {
    auto e = r.StartOrJoin(Req("fp" + std::to_string(i), "m", 0, SegmentLoad(4096)));
    ASSERT_TRUE(e.ok());
    ASSERT_TRUE(r.WaitReady(*e, Far()).ok());
  }
  // Each StartOrJoin joins the loads finished before it: only the last few (whose threads
  // may still be ending; more on a loaded machine, hence the bounded retry) remain, not one
  // thread per load ever run.
  for (int i = 0; i < 500 && r.load_threads() >= static_cast<size_t>(kLoads / 4); ++i) {
    ASSERT_TRUE(r.StartOrJoin(Req("fp0", "m", 0, SegmentLoad(4096))).ok());
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_LT(r.load_threads(), static_cast<size_t>(kLoads / 4));
}

TEST(Registry, FailedLoadReportsErrorAndIsRetried) {
  Registry r;
  auto e = r.StartOrJoin(
      Req("fp", "m", 0, [](Entry&) -> absl::StatusOr<std::unique_ptr<load::LoadedModel>> {
        return absl::InvalidArgumentError("model.safetensors: truncated");
      }));
  ASSERT_TRUE(e.ok());
  auto s = r.WaitReady(*e, Far());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("truncated"), absl::string_view::npos);
  EXPECT_EQ(r.Snapshot().at(0).state, State::kFailed);
  auto again = r.StartOrJoin(Req("fp", "m", 0, SegmentLoad(4096)));
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(r.WaitReady(*again, Far()).ok());
}

TEST(Registry, DiscardRemovesOnlyThatFailedEntry) {
  Registry r;
  auto failing = [](Entry&) -> absl::StatusOr<std::unique_ptr<load::LoadedModel>> {
    return absl::CancelledError("publisher went away");
  };
  auto e = r.StartOrJoin(Req("fp", "m", 4096, failing));
  ASSERT_TRUE(e.ok());
  EXPECT_FALSE(r.WaitReady(*e, Far()).ok());
  // A newer entry under the same key is not the failed one: it stays.
  auto newer = r.StartOrJoin(Req("fp", "m", 0, SegmentLoad(4096)));
  ASSERT_TRUE(newer.ok());
  ASSERT_TRUE(r.WaitReady(*newer, Far()).ok());
  EXPECT_FALSE(r.Discard(*e));
  EXPECT_FALSE(r.Discard(*newer));  // ready, not failed
  EXPECT_EQ(r.Find(K("fp")), *newer);
  ASSERT_EQ(r.Evict(K("fp"), "api"), Registry::Evicted::kGone);
  auto again = r.StartOrJoin(Req("fp", "m", 4096, failing));
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(r.WaitReady(*again, Far()).ok());
  EXPECT_TRUE(r.Discard(*again));
  EXPECT_EQ(r.Find(K("fp")), nullptr);
  EXPECT_TRUE(r.Snapshot().empty());
  EXPECT_EQ(r.used_bytes(), 0u);
}

TEST(Registry, LeasesAreCountedAndRemoved) {
  Registry r;
  auto e = *r.StartOrJoin(Req("fp", "m", 0, SegmentLoad(4096)));
  ASSERT_TRUE(r.WaitReady(e, Far()).ok());
  ASSERT_TRUE(r.AddLease(e, Lease("a", 1)).ok());
  ASSERT_TRUE(r.AddLease(e, Lease("b", 2)).ok());
  EXPECT_EQ(r.LeaseCount(K("fp")), 2u);
  EXPECT_TRUE(r.RemoveLease("a"));
  EXPECT_FALSE(r.RemoveLease("a"));
  EXPECT_EQ(r.LeaseCount(K("fp")), 1u);
  EXPECT_EQ(r.Snapshot().at(0).leases.at(0).id, "b");
}

TEST(Registry, EvictionKeepsContentAliveForHoldersAndEndsTheEntry) {
  Registry r;
  std::vector<std::string> evicted;
  r.SetEvictCallback(
      [&](const std::string& m, const std::string& why) { evicted.push_back(m + ":" + why); });
  auto e = *r.StartOrJoin(Req("fp", "m", 0, SegmentLoad(4096)));
  ASSERT_TRUE(r.WaitReady(e, Far()).ok());
  auto content = r.Content(e);
  ASSERT_TRUE(content.ok());
  EXPECT_EQ(r.Evict(K("fp"), "api"), Registry::Evicted::kGone);
  EXPECT_EQ(r.Evict(K("fp"), "api"), Registry::Evicted::kNone);
  EXPECT_EQ(r.Find(K("fp")), nullptr);
  EXPECT_EQ(r.StateOf(e), State::kGone);
  EXPECT_EQ((*content)->segments.size(), 1u);  // a holder's reference stays valid
  EXPECT_EQ(evicted, std::vector<std::string>{"m:api"});
  EXPECT_EQ(r.AddLease(e, Lease("x", 1)).code(), absl::StatusCode::kUnavailable);
}

TEST(Registry, BudgetEvictsLeastRecentlyUsedUnleasedEntries) {
  constexpr uint64_t kSeg = 2 << 20;
  Registry r(3 * kSeg);
  auto a = *r.StartOrJoin(Req("a", "a", kSeg, SegmentLoad(kSeg)));
  ASSERT_TRUE(r.WaitReady(a, Far()).ok());
  auto b = *r.StartOrJoin(Req("b", "b", kSeg, SegmentLoad(kSeg)));
  ASSERT_TRUE(r.WaitReady(b, Far()).ok());
  ASSERT_TRUE(r.AddLease(a, Lease("la", 1, /*claimed=*/true)).ok());  // a is leased: not evictable
  auto c = *r.StartOrJoin(Req("c", "c", 2 * kSeg, SegmentLoad(2 * kSeg)));
  ASSERT_TRUE(r.WaitReady(c, Far()).ok());
  EXPECT_NE(r.Find(K("a")), nullptr);
  EXPECT_EQ(r.Find(K("b")), nullptr);  // evicted for c
  auto d = r.StartOrJoin(Req("d", "d", 2 * kSeg, SegmentLoad(2 * kSeg)));
  // c is unleased and evictable; a is leased: after evicting c, 2 segments fit.
  ASSERT_TRUE(d.ok()) << d.status();
  auto big = r.StartOrJoin(Req("e", "e", 10 * kSeg, SegmentLoad(kSeg)));
  EXPECT_EQ(big.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(big.status().message().find("budget"), absl::string_view::npos);
}

TEST(Registry, SameFingerprintOnTwoDevicesIsTwoEntries) {
  Registry r;
  std::atomic<int> calls{0};
  auto a = *r.StartOrJoin(Req("fp", "m", 0, SegmentLoad(4096, &calls), "GPU-a"));
  auto b = *r.StartOrJoin(Req("fp", "m", 0, SegmentLoad(4096, &calls), "GPU-b", "peer"));
  ASSERT_TRUE(r.WaitReady(a, Far()).ok());
  ASSERT_TRUE(r.WaitReady(b, Far()).ok());
  EXPECT_EQ(calls.load(), 2);  // one load per device, not joined across devices
  EXPECT_NE(a.get(), b.get());
  EXPECT_EQ(r.Find(K("fp", "GPU-a")), a);
  EXPECT_EQ(r.Find(K("fp", "GPU-b")), b);
  EXPECT_EQ(r.Find(K("fp", "GPU-c")), nullptr);
  auto all = r.FindAll("fp");
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0]->device_uuid, "GPU-a");
  EXPECT_EQ(all[1]->device_uuid, "GPU-b");
  EXPECT_TRUE(r.FindAll("f").empty());  // no prefix matches
  auto snap = r.Snapshot();
  ASSERT_EQ(snap.size(), 2u);
  EXPECT_EQ(snap[0].device_uuid, "GPU-a");
  EXPECT_EQ(snap[0].source, "disk");
  EXPECT_EQ(snap[1].device_uuid, "GPU-b");
  EXPECT_EQ(snap[1].source, "peer");
  // Leases and eviction are per device.
  ASSERT_TRUE(r.AddLease(b, Lease("lb", 1, /*claimed=*/true)).ok());
  EXPECT_EQ(r.LeaseCount(K("fp", "GPU-a")), 0u);
  EXPECT_EQ(r.LeaseCount(K("fp", "GPU-b")), 1u);
  EXPECT_EQ(r.Evict(K("fp", "GPU-a"), "api"), Registry::Evicted::kGone);
  EXPECT_EQ(r.Find(K("fp", "GPU-a")), nullptr);
  EXPECT_EQ(r.Find(K("fp", "GPU-b")), b);
  EXPECT_TRUE(r.RemoveLease("lb"));
}

TEST(Registry, BudgetIsPerDevice) {
  constexpr uint64_t kSeg = 2 << 20;
  Registry r(2 * kSeg);
  auto a1 = *r.StartOrJoin(Req("a1", "m", 2 * kSeg, SegmentLoad(2 * kSeg), "GPU-a"));
  ASSERT_TRUE(r.WaitReady(a1, Far()).ok());
  // GPU-b has its own budget: no eviction on GPU-a.
  auto b1 = *r.StartOrJoin(Req("b1", "m", 2 * kSeg, SegmentLoad(2 * kSeg), "GPU-b"));
  ASSERT_TRUE(r.WaitReady(b1, Far()).ok());
  EXPECT_EQ(r.used_bytes("GPU-a"), 2 * kSeg);
  EXPECT_EQ(r.used_bytes("GPU-b"), 2 * kSeg);
  EXPECT_EQ(r.used_bytes(), 4 * kSeg);
  ASSERT_TRUE(r.AddLease(b1, Lease("lb", 1, /*claimed=*/true)).ok());
  // A second entry on GPU-a evicts GPU-a's unleased LRU entry only.
  auto a2 = *r.StartOrJoin(Req("a2", "m", kSeg, SegmentLoad(kSeg), "GPU-a"));
  ASSERT_TRUE(r.WaitReady(a2, Far()).ok());
  EXPECT_EQ(r.Find(K("a1", "GPU-a")), nullptr);
  EXPECT_NE(r.Find(K("b1", "GPU-b")), nullptr);
  // GPU-b is full of leased memory: refused, naming the device.
  auto b2 = r.StartOrJoin(Req("b2", "m", kSeg, SegmentLoad(kSeg), "GPU-b"));
  EXPECT_EQ(b2.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(b2.status().message().find("GPU-b"), absl::string_view::npos) << b2.status();
}

TEST(Registry, ImpossibleRequestFailsBeforeEvictingAnything) {
  constexpr uint64_t kSeg = 2 << 20;
  Registry r(4 * kSeg);
  std::vector<std::string> evicted;
  r.SetEvictCallback([&](const std::string& m, const std::string&) { evicted.push_back(m); });
  // What weightcache_budget_refusals_total counts (the "cache full" alert).
  std::vector<std::pair<std::string, std::string>> refused;
  r.SetBudgetRefusedCallback(
      [&](const std::string& m, const std::string& device) { refused.emplace_back(m, device); });
  auto a = *r.StartOrJoin(Req("a", "a", kSeg, SegmentLoad(kSeg)));
  ASSERT_TRUE(r.WaitReady(a, Far()).ok());
  auto b = *r.StartOrJoin(Req("b", "b", 2 * kSeg, SegmentLoad(2 * kSeg)));
  ASSERT_TRUE(r.WaitReady(b, Far()).ok());
  ASSERT_TRUE(r.AddLease(b, Lease("lb", 1, /*claimed=*/true)).ok());
  // 3 segments would fit only if the leased b went too: refused, a stays.
  auto big = r.StartOrJoin(Req("c", "c", 3 * kSeg, SegmentLoad(kSeg)));
  ASSERT_EQ(big.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(big.status().message()), ::testing::HasSubstr("nothing was evicted"));
  EXPECT_NE(r.Find(K("a")), nullptr);
  EXPECT_TRUE(evicted.empty());
  const std::vector<std::pair<std::string, std::string>> want_refused = {{"c", a->device_uuid}};
  EXPECT_EQ(refused, want_refused);
  // 2 segments fit by evicting a: that eviction is counted through the callback, and no
  // refusal.
  auto fits = r.StartOrJoin(Req("d", "d", 2 * kSeg, SegmentLoad(kSeg)));
  ASSERT_TRUE(fits.ok()) << fits.status();
  EXPECT_EQ(evicted, std::vector<std::string>{"a"});
  EXPECT_EQ(refused, want_refused);
}

TEST(Registry, EvictedWhileLeasedDrainsUntilTheLastLeaseEnds) {
  constexpr uint64_t kSeg = 2 << 20;
  Registry r(2 * kSeg);
  auto e = *r.StartOrJoin(Req("fp", "m", kSeg, SegmentLoad(kSeg)));
  ASSERT_TRUE(r.WaitReady(e, Far()).ok());
  ASSERT_TRUE(r.AddLease(e, Lease("l1", 1, /*claimed=*/true)).ok());
  ASSERT_TRUE(r.AddLease(e, Lease("l2", 2, /*claimed=*/true)).ok());
  EXPECT_EQ(r.Evict(K("fp"), "api"), Registry::Evicted::kDraining);
  EXPECT_EQ(r.Find(K("fp")), nullptr);  // no longer served
  auto snap = r.Snapshot();
  ASSERT_EQ(snap.size(), 1u);
  EXPECT_EQ(snap[0].state, State::kDraining);
  EXPECT_EQ(snap[0].leases.size(), 2u);
  EXPECT_EQ(snap[0].bytes, kSeg);
  EXPECT_EQ(r.used_bytes(), kSeg);  // still in use: still counted
  // A reload under the same key is a new entry; the old lease does not belong to it.
  auto again = *r.StartOrJoin(Req("fp", "m", kSeg, SegmentLoad(kSeg)));
  ASSERT_TRUE(r.WaitReady(again, Far()).ok());
  EXPECT_NE(again.get(), e.get());
  EXPECT_TRUE(r.HasLease(e, "l1"));
  EXPECT_FALSE(r.HasLease(again, "l1"));
  EXPECT_TRUE(r.RemoveLease("l1"));
  EXPECT_EQ(r.Snapshot().size(), 2u);
  EXPECT_TRUE(r.RemoveLease("l2"));
  snap = r.Snapshot();
  ASSERT_EQ(snap.size(), 1u);
  EXPECT_EQ(snap[0].state, State::kReady);
  EXPECT_EQ(r.StateOf(e), State::kGone);
  EXPECT_EQ(r.used_bytes(), kSeg);
}

TEST(Registry, UnclaimedLeasesDoNotPinTheirEntry) {
  constexpr uint64_t kSeg = 2 << 20;
  Registry r(2 * kSeg);
  auto a = *r.StartOrJoin(Req("a", "a", kSeg, SegmentLoad(kSeg)));
  ASSERT_TRUE(r.WaitReady(a, Far()).ok());
  ASSERT_TRUE(r.AddLease(a, Lease("token-never-claimed", 1)).ok());
  auto b = *r.StartOrJoin(Req("b", "b", 2 * kSeg, SegmentLoad(2 * kSeg)));
  ASSERT_TRUE(r.WaitReady(b, Far()).ok());
  EXPECT_EQ(r.Find(K("a")), nullptr);  // evicted: its only lease was never claimed
  EXPECT_FALSE(r.HasLease(a, "token-never-claimed"));
  EXPECT_EQ(r.StateOf(a), State::kGone);  // not draining: nothing maps it
  // A claimed lease does pin.
  ASSERT_TRUE(r.AddLease(b, Lease("claimed", 1)).ok());
  r.SetLeasePeer("claimed", 42, 0);
  auto c = r.StartOrJoin(Req("c", "c", kSeg, SegmentLoad(kSeg)));
  EXPECT_EQ(c.status().code(), absl::StatusCode::kResourceExhausted);
}

// Integrity (issue 27): every load is digested before it is ready; a failed digest fails it.
TEST(Registry, ALoadIsDigestedBeforeItIsReadyAndAFailedDigestFailsIt) {
  Registry r;
  std::atomic<int> digested{0};
  r.SetDigester(
      [&](const Entry& e,
          const load::LoadedModel& m) -> absl::StatusOr<std::vector<integrity::SegmentDigest>> {
        digested++;
        if (e.model == "bad") return absl::InternalError("the GPU said no");
        return std::vector<integrity::SegmentDigest>(m.segments.size(),
                                                     integrity::SegmentDigest{{42}, {}});
      });
  auto e = r.StartOrJoin(Req("fp", "m", 0, SegmentLoad(4096)));
  ASSERT_TRUE(e.ok());
  ASSERT_TRUE(r.WaitReady(*e, Far()).ok());
  auto d = r.Digests(*e);
  ASSERT_NE(d, nullptr);
  ASSERT_EQ(d->size(), 1u);
  EXPECT_EQ((*d)[0].chunks[0], 42u);
  EXPECT_GE(r.Snapshot()[0].verified_seconds_ago, 0);
  auto bad = r.StartOrJoin(Req("fp2", "bad", 0, SegmentLoad(4096)));
  ASSERT_TRUE(bad.ok());
  const absl::Status st = r.WaitReady(*bad, Far());
  EXPECT_EQ(st.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(std::string(st.message()), ::testing::HasSubstr("digest of the loaded segments"));
  EXPECT_EQ(digested.load(), 2);
}

// A fill whose digests are not what they must be (a peer copy of a changed source, memory
// changed while the keeper held it) fails with the check's error and is not served.
TEST(Registry, AFillWhoseDigestsFailTheirCheckFails) {
  Registry r;
  r.SetDigester(
      [](const Entry&,
         const load::LoadedModel& m) -> absl::StatusOr<std::vector<integrity::SegmentDigest>> {
        return std::vector<integrity::SegmentDigest>(m.segments.size(),
                                                     integrity::SegmentDigest{{7}, {}});
      });
  auto req = Req("fp", "m", 0, SegmentLoad(4096));
  std::vector<integrity::SegmentDigest> seen;
  req.check_digests = [&](const std::vector<integrity::SegmentDigest>& d) {
    seen = d;
    return absl::DataLossError("segment 0 differs");
  };
  auto e = r.StartOrJoin(std::move(req));
  ASSERT_TRUE(e.ok());
  const absl::Status st = r.WaitReady(*e, Far());
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(st.message()), ::testing::HasSubstr("segment 0 differs"));
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].chunks[0], 7u);
  EXPECT_TRUE(r.ReadyEntries().empty());
}

// A fill that digested its segments to check them (a peer fill) hands those digests over:
// the registry's digester does not pass over the bytes again, the entry's digests are the
// fill's and its check sees them. A fill that took none, or not one per segment, is
// digested by the registry once.
TEST(Registry, HashedOnceAFillsOwnDigestsBecomeTheEntrysWithoutDigestingAgain) {
  Registry r;
  std::atomic<int> digested{0};
  r.SetDigester(
      [&](const Entry&,
          const load::LoadedModel& m) -> absl::StatusOr<std::vector<integrity::SegmentDigest>> {
        digested++;
        return std::vector<integrity::SegmentDigest>(m.segments.size(),
                                                     integrity::SegmentDigest{{7}, {}});
      });
  auto req = Req("fp", "m", 0, SegmentLoad(4096));
  int taken_calls = 0;
  req.taken_digests = [&] {
    taken_calls++;
    return std::vector<integrity::SegmentDigest>{{{42}, "s"}};
  };
  std::vector<integrity::SegmentDigest> checked;
  req.check_digests = [&](const std::vector<integrity::SegmentDigest>& d) {
    checked = d;
    return absl::OkStatus();
  };
  auto e = r.StartOrJoin(std::move(req));
  ASSERT_TRUE(e.ok());
  ASSERT_TRUE(r.WaitReady(*e, Far()).ok());
  EXPECT_EQ(digested.load(), 0);
  EXPECT_EQ(taken_calls, 1);
  ASSERT_EQ(checked.size(), 1u);
  EXPECT_EQ(checked[0].chunks[0], 42u);
  auto d = r.Digests(*e);
  ASSERT_NE(d, nullptr);
  ASSERT_EQ(d->size(), 1u);
  EXPECT_EQ((*d)[0].chunks[0], 42u);
  EXPECT_EQ((*d)[0].sha256, "s");

  auto short_req = Req("fp2", "m2", 0, SegmentLoad(4096));
  short_req.taken_digests = [] { return std::vector<integrity::SegmentDigest>{}; };
  auto e2 = r.StartOrJoin(std::move(short_req));
  ASSERT_TRUE(e2.ok());
  ASSERT_TRUE(r.WaitReady(*e2, Far()).ok());
  EXPECT_EQ(digested.load(), 1);
  ASSERT_NE(r.Digests(*e2), nullptr);
  EXPECT_EQ((*r.Digests(*e2))[0].chunks[0], 7u);
}

// A corrupt entry is never found again; while a lease maps it, it drains (shown corrupt)
// and goes with the last lease; a new load of its key starts clean.
TEST(Registry, ACorruptEntryLeavesTheLookupAndDrainsWithItsLeases) {
  Registry r;
  std::vector<std::string> evictions;
  r.SetEvictCallback([&](const std::string& model, const std::string& reason) {
    evictions.push_back(model + ":" + reason);
  });
  auto e = r.StartOrJoin(Req("fp", "m", 0, SegmentLoad(4096)));
  ASSERT_TRUE(e.ok());
  ASSERT_TRUE(r.WaitReady(*e, Far()).ok());
  ASSERT_EQ(r.ReadyEntries().size(), 1u);
  LeaseRecord lease;
  lease.id = "L1";
  ASSERT_TRUE(r.AddLease(*e, lease).ok());
  r.SetLeasePeer("L1", 1, 0);
  EXPECT_EQ(r.MarkCorrupt(*e, "segment 0 bytes [0, 4096) changed"), Registry::Evicted::kDraining);
  EXPECT_EQ(r.Find(K("fp")), nullptr);
  EXPECT_TRUE(r.ReadyEntries().empty());
  EXPECT_EQ(r.Content(*e).status().code(), absl::StatusCode::kFailedPrecondition);
  auto snap = r.Snapshot();
  ASSERT_EQ(snap.size(), 1u);
  EXPECT_EQ(snap[0].corrupt, "segment 0 bytes [0, 4096) changed");
  EXPECT_EQ(snap[0].state, State::kDraining);
  EXPECT_EQ(evictions, std::vector<std::string>{"m:corrupt"});
  bool started = false;
  auto again = r.StartOrJoin(Req("fp", "m", 0, SegmentLoad(4096)), &started);
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(started);
  EXPECT_NE(*again, *e);
  ASSERT_TRUE(r.WaitReady(*again, Far()).ok());
  EXPECT_TRUE(r.RemoveLease("L1"));
  snap = r.Snapshot();
  ASSERT_EQ(snap.size(), 1u);  // the corrupt one went with its last lease
  EXPECT_TRUE(snap[0].corrupt.empty());
  // Marking an entry that is no longer its key's live one evicts nothing else.
  EXPECT_EQ(r.MarkCorrupt(*e, "again"), Registry::Evicted::kNone);
  EXPECT_EQ(r.Find(K("fp")), *again);
}

}  // namespace
}  // namespace weightcache::cache
