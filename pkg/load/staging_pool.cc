#include "pkg/load/staging_pool.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "pkg/util/log.h"

namespace weightcache::load {

StagingPool::Lease::Lease(Lease&& o) noexcept
    : pool_(std::exchange(o.pool_, nullptr)), buffers_(std::move(o.buffers_)), reused_(o.reused_) {
  o.buffers_.clear();
}

StagingPool::Lease& StagingPool::Lease::operator=(Lease&& o) noexcept {
  if (this != &o) {
    Release();
    pool_ = std::exchange(o.pool_, nullptr);
    buffers_ = std::move(o.buffers_);
    o.buffers_.clear();
    reused_ = o.reused_;
  }
  return *this;
}

void StagingPool::Lease::Release() {
  if (pool_ != nullptr && !buffers_.empty()) pool_->Return(buffers_);
  buffers_.clear();
  pool_ = nullptr;
}

StagingPool::StagingPool(std::unique_ptr<Allocator> allocator, uint64_t max_idle_bytes)
    : allocator_(std::move(allocator)), max_idle_bytes_(max_idle_bytes) {}

StagingPool::~StagingPool() {
  MutexLock l(mu_);
  if (counters_.taken_bytes != 0) {
    WC_LOG_ERROR("staging pool destroyed with %llu bytes still taken",
                 static_cast<unsigned long long>(counters_.taken_bytes));
  }
  for (const auto& b : idle_) allocator_->Free(b.data, b.bytes);
  idle_.clear();
}

absl::StatusOr<StagingPool::Lease> StagingPool::Take(int ordinal, size_t count, uint64_t bytes) {
  Lease lease;
  lease.pool_ = this;
  {
    MutexLock l(mu_);
    // idle_ is sorted by size: the first fitting buffers are the smallest that fit.
    auto it = std::lower_bound(idle_.begin(), idle_.end(), bytes,
                               [](const Buffer& b, uint64_t n) { return b.bytes < n; });
    while (it != idle_.end() && lease.buffers_.size() < count) {
      lease.buffers_.push_back(*it);
      counters_.idle_bytes -= it->bytes;
      counters_.taken_bytes += it->bytes;
      ++counters_.reuses;
      it = idle_.erase(it);
    }
    lease.reused_ = static_cast<uint32_t>(lease.buffers_.size());
  }
  while (lease.buffers_.size() < count) {
    absl::StatusOr<void*> p = allocator_->Allocate(ordinal, bytes);
    if (!p.ok()) return p.status();  // the lease gives back what it holds
    {
      MutexLock l(mu_);
      counters_.taken_bytes += bytes;
      ++counters_.allocations;
    }
    lease.buffers_.push_back({static_cast<uint8_t*>(*p), bytes});
  }
  return lease;
}

void StagingPool::Return(const std::vector<Buffer>& buffers) {
  std::vector<Buffer> drop;
  {
    MutexLock l(mu_);
    for (const auto& b : buffers) {
      counters_.taken_bytes -= b.bytes;
      counters_.idle_bytes += b.bytes;
      idle_.insert(
          std::upper_bound(idle_.begin(), idle_.end(), b,
                           [](const Buffer& x, const Buffer& y) { return x.bytes < y.bytes; }),
          b);
    }
    // Smallest first: a large idle buffer serves any later request, a small one may not.
    while (counters_.idle_bytes > max_idle_bytes_ && !idle_.empty()) {
      drop.push_back(idle_.front());
      counters_.idle_bytes -= idle_.front().bytes;
      ++counters_.frees;
      idle_.erase(idle_.begin());
    }
  }
  for (const auto& b : drop) allocator_->Free(b.data, b.bytes);  // outside the lock: slow
}

StagingPool::Counters StagingPool::counters() const {
  MutexLock l(mu_);
  return counters_;
}

}  // namespace weightcache::load
