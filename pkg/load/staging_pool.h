// Page-locked host buffers kept between GPU loads.
//
// Pinning is the largest fixed cost of a load: cuMemHostAlloc of a 256 MiB staging ring
// takes ~0.1 s on the H200 machine (1 GiB: 0.5 s), a third of the time an 8 GiB checkpoint
// takes to load from the page cache (docs/benchmarks.md, "Cold load"). The daemon keeps one pool
// for its lifetime, so only its first load pays it. The buffers are portable (usable from every
// device's context): one pool serves every GPU of the node.
//
// Take() hands out the smallest idle buffers that are large enough and allocates the rest;
// a Lease gives them back when it ends. Idle buffers above `max_idle_bytes` are freed,
// smallest first (a large buffer serves any later request, a small one may not).
// Thread-safe; concurrent loads get distinct buffers.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "pkg/util/mutex.h"

namespace weightcache::load {

class StagingPool {
 public:
  // Where the page-locked memory comes from. `ordinal` is the CUDA device of the load that
  // asks (its context is the one the allocation is made in).
  class Allocator {
   public:
    virtual ~Allocator() = default;
    virtual absl::StatusOr<void*> Allocate(int ordinal, uint64_t bytes) = 0;
    virtual void Free(void* p, uint64_t bytes) = 0;
  };

  struct Buffer {
    uint8_t* data = nullptr;
    uint64_t bytes = 0;
  };

  // Buffers taken from the pool; they go back when the lease ends (or is moved from).
  class Lease {
   public:
    Lease() = default;
    Lease(Lease&& o) noexcept;
    Lease& operator=(Lease&& o) noexcept;
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    ~Lease() { Release(); }

    const std::vector<Buffer>& buffers() const { return buffers_; }
    uint32_t reused() const { return reused_; }  // of them, already pinned before Take

   private:
    friend class StagingPool;
    void Release();
    StagingPool* pool_ = nullptr;
    std::vector<Buffer> buffers_;
    uint32_t reused_ = 0;
  };

  struct Counters {
    uint64_t idle_bytes = 0;   // pinned and not taken
    uint64_t taken_bytes = 0;  // pinned and in a lease
    uint64_t allocations = 0;  // buffers allocated since the start
    uint64_t reuses = 0;       // buffers handed out again without allocating
    uint64_t frees = 0;        // buffers freed (above max_idle_bytes, or at the end)
  };

  StagingPool(std::unique_ptr<Allocator> allocator, uint64_t max_idle_bytes);
  // Frees the idle buffers. Every lease must have ended.
  ~StagingPool();
  StagingPool(const StagingPool&) = delete;
  StagingPool& operator=(const StagingPool&) = delete;

  // `count` buffers of at least `bytes` each, for a load on device `ordinal`. When an
  // allocation fails, the buffers taken so far go back and the error is returned.
  absl::StatusOr<Lease> Take(int ordinal, size_t count, uint64_t bytes);

  Counters counters() const;
  uint64_t max_idle_bytes() const { return max_idle_bytes_; }

 private:
  // Back to idle_; then frees idle buffers, smallest first, above max_idle_bytes_.
  void Return(const std::vector<Buffer>& buffers);

  const std::unique_ptr<Allocator> allocator_;
  const uint64_t max_idle_bytes_;
  mutable Mutex mu_;
  std::vector<Buffer> idle_ ABSL_GUARDED_BY(mu_);  // sorted by size
  Counters counters_ ABSL_GUARDED_BY(mu_);
};

// A pool of cuMemHostAlloc(PORTABLE) buffers (CUDA builds; without CUDA every Take answers
// UNIMPLEMENTED). The allocator retains the primary context of each device it allocates
// for until the pool ends.
std::unique_ptr<StagingPool> MakePinnedStagingPool(uint64_t max_idle_bytes);

}  // namespace weightcache::load
