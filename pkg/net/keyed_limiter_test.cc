#include "pkg/net/keyed_limiter.h"

#include <gtest/gtest.h>

namespace weightcache::net {
namespace {

using V = KeyedLimiter::Verdict;

TEST(KeyedLimiter, AKeyPastItsCapIsRefusedWhileOthersAreServed) {
  KeyedLimiter lim({.total = 10, .per_key = 2, .over_cap = 0});
  auto a1 = lim.Take("pod:a");
  auto a2 = lim.Take("pod:a");
  auto a3 = lim.Take("pod:a");
  EXPECT_EQ(a1.verdict, V::kWithin);
  EXPECT_EQ(a2.verdict, V::kWithin);
  EXPECT_EQ(a3.verdict, V::kRefusedKey);
  EXPECT_FALSE(a3.slot.held());
  EXPECT_EQ(a3.key_held, 2u);
  EXPECT_EQ(lim.Take("pod:b").verdict, V::kWithin);  // destroyed at once: given back
  EXPECT_EQ(lim.HeldBy("pod:a"), 2u);
  EXPECT_EQ(lim.HeldBy("pod:b"), 0u);
  EXPECT_EQ(lim.Total(), 2u);
}

TEST(KeyedLimiter, TheBandPastTheCapIsTakenMarkedThenRefused) {
  KeyedLimiter lim({.total = 100, .per_key = 1, .over_cap = 2});
  auto a = lim.Take("k");
  auto b = lim.Take("k");
  auto c = lim.Take("k");
  auto d = lim.Take("k");
  EXPECT_EQ(a.verdict, V::kWithin);
  EXPECT_EQ(b.verdict, V::kOverCap);
  EXPECT_EQ(c.verdict, V::kOverCap);
  EXPECT_EQ(d.verdict, V::kRefusedKey);
  EXPECT_TRUE(b.slot.held());
  EXPECT_EQ(lim.HeldBy("k"), 3u);
}

TEST(KeyedLimiter, AKeyWithACapOfItsOwnIsHeldToIt) {
  KeyedLimiter lim({.total = 100, .per_key = 5, .over_cap = 1, .own_caps = {{"unknown", 2}}});
  EXPECT_EQ(lim.CapOf("unknown"), 2u);
  EXPECT_EQ(lim.CapOf("pod:a"), 5u);
  auto a = lim.Take("unknown");
  auto b = lim.Take("unknown");
  auto c = lim.Take("unknown");
  EXPECT_EQ(c.verdict, V::kOverCap);
  EXPECT_EQ(lim.Take("unknown").verdict, V::kRefusedKey);
  EXPECT_EQ(lim.Take("pod:a").verdict, V::kWithin);
}

TEST(KeyedLimiter, TheTotalCapRefusesEveryKey) {
  KeyedLimiter lim({.total = 2, .per_key = 5, .over_cap = 0});
  auto a = lim.Take("a");
  auto b = lim.Take("b");
  auto c = lim.Take("c");
  EXPECT_EQ(c.verdict, V::kRefusedTotal);
  EXPECT_EQ(c.total_held, 2u);
  a.slot.Reset();
  EXPECT_EQ(lim.Take("c").verdict, V::kWithin);
}

TEST(KeyedLimiter, SlotsGiveBackWhenDroppedMovedOrOutlivingTheLimiter) {
  KeyedLimiter::Slot kept;
  {
    KeyedLimiter lim({.total = 4, .per_key = 4, .over_cap = 0});
    auto a = lim.Take("a", 3);
    KeyedLimiter::Slot moved = std::move(a.slot);
    EXPECT_FALSE(a.slot.held());
    EXPECT_EQ(lim.Total(), 3u);
    moved = lim.Take("b", 1).slot;  // the move-assignment gives a's 3 back
    EXPECT_EQ(lim.HeldBy("a"), 0u);
    EXPECT_EQ(lim.Total(), 1u);
    EXPECT_EQ(lim.Keys(), 1u);
    kept = std::move(moved);
  }
  kept.Reset();  // the limiter is gone; its counts are not
  EXPECT_FALSE(kept.held());
}

TEST(KeyedLimiter, AmountsShareABudgetByKey) {
  // Bytes: a budget of 1 GiB, half of it per key at most.
  KeyedLimiter lim({.total = 1 << 30, .per_key = 512 << 20, .over_cap = 0});
  auto a = lim.Take("pod:a", 512 << 20);
  EXPECT_EQ(a.verdict, V::kWithin);
  EXPECT_EQ(lim.Take("pod:a", 1).verdict, V::kRefusedKey);
  auto b = lim.Take("pod:b", 40 << 20);
  EXPECT_EQ(b.verdict, V::kWithin);
  EXPECT_EQ(lim.Take("pod:c", 600 << 20).verdict, V::kRefusedTotal);
  a.slot.Reset();
  EXPECT_EQ(lim.Take("pod:c", 513 << 20).verdict, V::kRefusedKey);
  // Unbounded caps never overflow.
  KeyedLimiter open({});
  auto x = open.Take("x", KeyedLimiter::kUnbounded - 1);
  EXPECT_EQ(x.verdict, V::kWithin);
  EXPECT_EQ(open.Take("y", 2).verdict, V::kRefusedTotal);
}

}  // namespace
}  // namespace weightcache::net
