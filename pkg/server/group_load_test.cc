#include "pkg/server/internal/group_load.h"

#include <atomic>
#include <thread>

#include "gtest/gtest.h"

namespace weightcache::server {
namespace {

// A rank whose plan holds one tensor of `bytes` source bytes.
std::unique_ptr<load::LoadedModel> Rank(uint64_t bytes) {
  auto m = std::make_unique<load::LoadedModel>();
  load::PlannedTensor t;
  t.name = "w";
  t.nbytes = bytes;
  m->plan.tensors.push_back(t);
  m->stats.bytes_read = 1000;  // the group's
  return m;
}

TEST(GroupLoad, OneLoadForTheMembersEachTakesItsOwnRankAndBytes) {
  std::atomic<int> loads{0};
  std::vector<size_t> seen;
  GroupLoad g(3,
              [&](const std::vector<size_t>& members, load::LoadProgress* p)
                  -> absl::StatusOr<std::vector<std::unique_ptr<load::LoadedModel>>> {
                ++loads;
                seen = members;
                p->SetTotal(1000);
                p->SetDone(1000);
                std::vector<std::unique_ptr<load::LoadedModel>> out;
                for (size_t m : members) out.push_back(Rank(100 * (m + 1)));
                return out;
              });
  g.Settle({true, false, true});  // rank 1 joined another entry
  load::LoadProgress p0, p2, p1;
  absl::StatusOr<std::unique_ptr<load::LoadedModel>> r2;
  std::thread t([&] { r2 = g.Take(2, &p2); });
  auto r0 = g.Take(0, &p0);
  t.join();
  ASSERT_TRUE(r0.ok()) << r0.status();
  ASSERT_TRUE(r2.ok()) << r2.status();
  EXPECT_EQ(loads.load(), 1);
  EXPECT_EQ(seen, (std::vector<size_t>{0, 2}));
  EXPECT_EQ((*r0)->plan.tensors[0].nbytes, 100u);
  EXPECT_EQ((*r2)->plan.tensors[0].nbytes, 300u);
  // Each entry counts its own rank, not the group's 1000 bytes read.
  EXPECT_EQ(p0.total(), 100u);
  EXPECT_EQ(p0.done(), 100u);
  EXPECT_EQ(p2.total(), 300u);
  auto r1 = g.Take(1, &p1);
  EXPECT_EQ(r1.status().code(), absl::StatusCode::kInternal);
  EXPECT_NE(r1.status().message().find("not a member"), absl::string_view::npos);
}

TEST(GroupLoad, AFailedLoadFailsEveryMemberWithItsError) {
  std::atomic<int> loads{0};
  GroupLoad g(
      2,
      [&](const std::vector<size_t>&,
          load::LoadProgress*) -> absl::StatusOr<std::vector<std::unique_ptr<load::LoadedModel>>> {
        ++loads;
        return absl::UnavailableError("model 'm': files changed while loading");
      });
  g.Settle({true, true});
  load::LoadProgress a, b;
  auto ra = g.Take(0, &a);
  auto rb = g.Take(1, &b);
  EXPECT_EQ(loads.load(), 1);
  EXPECT_EQ(ra.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(rb.status(), ra.status());
}

TEST(GroupLoad, AWaitingMemberForwardsItsCancellationToTheRunningLoad) {
  std::atomic<bool> started{false};
  GroupLoad g(2,
              [&](const std::vector<size_t>& members, load::LoadProgress* p)
                  -> absl::StatusOr<std::vector<std::unique_ptr<load::LoadedModel>>> {
                started = true;
                while (!p->cancelled()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
                (void)members;
                return absl::CancelledError("load stopped");
              });
  g.Settle({true, true});
  load::LoadProgress runner, waiter;
  absl::StatusOr<std::unique_ptr<load::LoadedModel>> rr;
  std::thread t([&] { rr = g.Take(0, &runner); });
  while (!started) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  waiter.Cancel();  // e.g. the waiting rank's entry was evicted while loading
  auto rw = g.Take(1, &waiter);
  t.join();
  EXPECT_EQ(rr.status().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(rw.status().code(), absl::StatusCode::kCancelled);
}

}  // namespace
}  // namespace weightcache::server
