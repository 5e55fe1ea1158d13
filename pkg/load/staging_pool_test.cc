#include "pkg/load/staging_pool.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace weightcache::load {
namespace {

// Plain heap memory standing in for page-locked memory; records every call.
class HeapAllocator : public StagingPool::Allocator {
 public:
  struct Log {
    std::mutex mu;
    std::map<void*, uint64_t> live;
    std::vector<uint64_t> allocated, freed;
    int fail_after = -1;  // allocations allowed before Allocate fails (-1: never)
  };
  explicit HeapAllocator(Log* log) : log_(log) {}
  absl::StatusOr<void*> Allocate(int, uint64_t bytes) override {
    std::lock_guard<std::mutex> l(log_->mu);
    if (log_->fail_after == 0) return absl::ResourceExhaustedError("no pinned memory left");
    if (log_->fail_after > 0) --log_->fail_after;
    void* p = std::malloc(bytes);
    std::memset(p, 0xA5, bytes);
    log_->live[p] = bytes;
    log_->allocated.push_back(bytes);
    return p;
  }
  void Free(void* p, uint64_t bytes) override {
    std::lock_guard<std::mutex> l(log_->mu);
    EXPECT_EQ(log_->live.at(p), bytes);
    log_->live.erase(p);
    log_->freed.push_back(bytes);
    std::free(p);
  }

 private:
  Log* log_;
};

constexpr uint64_t kMiB = 1 << 20;

TEST(StagingPool, SecondLoadReusesTheBuffersOfTheFirst) {
  HeapAllocator::Log log;
  StagingPool pool(std::make_unique<HeapAllocator>(&log), 64 * kMiB);
  std::set<uint8_t*> first;
  {
    auto lease = pool.Take(0, 4, 8 * kMiB);
    ASSERT_TRUE(lease.ok()) << lease.status();
    EXPECT_EQ(lease->reused(), 0u);
    ASSERT_EQ(lease->buffers().size(), 4u);
    for (const auto& b : lease->buffers()) {
      EXPECT_EQ(b.bytes, 8 * kMiB);
      b.data[b.bytes - 1] = 1;  // writable to the end
      first.insert(b.data);
    }
    EXPECT_EQ(first.size(), 4u);
    EXPECT_EQ(pool.counters().taken_bytes, 32 * kMiB);
  }
  EXPECT_EQ(pool.counters().idle_bytes, 32 * kMiB);
  EXPECT_EQ(pool.counters().taken_bytes, 0u);
  auto again = pool.Take(1, 4, 8 * kMiB);  // another device: the memory is portable
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->reused(), 4u);
  for (const auto& b : again->buffers()) EXPECT_TRUE(first.count(b.data)) << "not reused";
  EXPECT_EQ(log.allocated.size(), 4u);
  EXPECT_EQ(pool.counters().reuses, 4u);
  EXPECT_EQ(pool.counters().allocations, 4u);
}

TEST(StagingPool, LargerIdleBuffersServeSmallerRequestsSmallestFirst) {
  HeapAllocator::Log log;
  StagingPool pool(std::make_unique<HeapAllocator>(&log), 1024 * kMiB);
  {
    auto a = pool.Take(0, 1, 16 * kMiB);
    auto b = pool.Take(0, 1, 4 * kMiB);
    auto c = pool.Take(0, 1, 1 * kMiB);
    ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  }
  // 2 MiB: the 4 MiB buffer, not the 16 MiB one; the 1 MiB one is too small.
  auto d = pool.Take(0, 1, 2 * kMiB);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->buffers()[0].bytes, 4 * kMiB);
  EXPECT_EQ(d->reused(), 1u);
  // Two of 8 MiB: the 16 MiB one fits, the second is allocated.
  auto e = pool.Take(0, 2, 8 * kMiB);
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->reused(), 1u);
  EXPECT_EQ(e->buffers()[0].bytes, 16 * kMiB);
  EXPECT_EQ(e->buffers()[1].bytes, 8 * kMiB);
  EXPECT_EQ(log.allocated.size(), 4u);
}

TEST(StagingPool, IdleMemoryAboveTheLimitIsFreedSmallestFirst) {
  HeapAllocator::Log log;
  StagingPool pool(std::make_unique<HeapAllocator>(&log), 20 * kMiB);
  {
    auto a = pool.Take(0, 1, 16 * kMiB);
    auto b = pool.Take(0, 2, 4 * kMiB);
    ASSERT_TRUE(a.ok() && b.ok());
  }
  // 24 MiB came back, 20 may stay: one 4 MiB buffer is freed, the 16 MiB one kept.
  ASSERT_EQ(log.freed.size(), 1u);
  EXPECT_EQ(log.freed[0], 4 * kMiB);
  EXPECT_EQ(pool.counters().idle_bytes, 20 * kMiB);
  EXPECT_EQ(pool.counters().frees, 1u);
}

TEST(StagingPool, ZeroLimitFreesEverythingWhenTheLeaseEnds) {
  HeapAllocator::Log log;
  StagingPool pool(std::make_unique<HeapAllocator>(&log), 0);
  {
    auto a = pool.Take(0, 3, kMiB);
    ASSERT_TRUE(a.ok());
    EXPECT_EQ(log.live.size(), 3u);
  }
  EXPECT_TRUE(log.live.empty());
  EXPECT_EQ(pool.counters().idle_bytes, 0u);
}

TEST(StagingPool, FailedAllocationGivesBackWhatWasTakenAndNamesTheError) {
  HeapAllocator::Log log;
  StagingPool pool(std::make_unique<HeapAllocator>(&log), 64 * kMiB);
  { ASSERT_TRUE(pool.Take(0, 1, kMiB).ok()); }  // one idle buffer
  log.fail_after = 1;                           // the second new one fails
  auto lease = pool.Take(0, 4, kMiB);
  ASSERT_FALSE(lease.ok());
  EXPECT_NE(lease.status().message().find("no pinned memory left"), std::string::npos);
  // The reused buffer and the one allocated went back; nothing leaked, nothing taken.
  EXPECT_EQ(pool.counters().taken_bytes, 0u);
  EXPECT_EQ(pool.counters().idle_bytes, 2 * kMiB);
  EXPECT_EQ(log.live.size(), 2u);
}

TEST(StagingPool, MovedLeaseReturnsOnce) {
  HeapAllocator::Log log;
  StagingPool pool(std::make_unique<HeapAllocator>(&log), 64 * kMiB);
  {
    auto a = pool.Take(0, 2, kMiB);
    ASSERT_TRUE(a.ok());
    StagingPool::Lease moved = std::move(*a);
    StagingPool::Lease assigned;
    assigned = std::move(moved);
    EXPECT_EQ(assigned.buffers().size(), 2u);
    EXPECT_EQ(pool.counters().taken_bytes, 2 * kMiB);
  }
  EXPECT_EQ(pool.counters().idle_bytes, 2 * kMiB);
  EXPECT_EQ(pool.counters().taken_bytes, 0u);
}

TEST(StagingPool, ConcurrentLoadsGetDistinctBuffers) {
  HeapAllocator::Log log;
  StagingPool pool(std::make_unique<HeapAllocator>(&log), 256 * kMiB);
  constexpr int kThreads = 8, kRounds = 50;
  std::mutex mu;
  std::set<uint8_t*> in_use;
  std::atomic<int> overlaps{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int r = 0; r < kRounds; ++r) {
        auto lease = pool.Take(t % 2, 2, kMiB);
        ASSERT_TRUE(lease.ok());
        {
          std::lock_guard<std::mutex> l(mu);
          for (const auto& b : lease->buffers()) {
            if (!in_use.insert(b.data).second) ++overlaps;
          }
        }
        std::this_thread::yield();
        std::lock_guard<std::mutex> l(mu);
        for (const auto& b : lease->buffers()) in_use.erase(b.data);
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(overlaps.load(), 0);
  // At most one ring per thread was ever pinned.
  EXPECT_LE(log.allocated.size(), static_cast<size_t>(2 * kThreads));
  EXPECT_EQ(pool.counters().taken_bytes, 0u);
}

}  // namespace
}  // namespace weightcache::load
