// Built only without CUDA: no cuda-vmm segment can exist, so the GPU path is never taken.
#include "pkg/load/internal/cuda_load.h"
#include "pkg/load/staging_pool.h"

namespace weightcache::load::internal {

absl::Status ScatterThroughPinnedStaging(const ScatterPlan&, const std::vector<ScatterFile>&,
                                         const std::vector<std::vector<memory::Segment*>>&,
                                         const LoadOptions&, LoadProgress*, LoadStats*) {
  return absl::UnimplementedError(
      "loading into GPU memory: this weightcache was built without CUDA");
}

}  // namespace weightcache::load::internal

namespace weightcache::load {
namespace {

class NoPinnedMemory : public StagingPool::Allocator {
 public:
  absl::StatusOr<void*> Allocate(int, uint64_t) override {
    return absl::UnimplementedError(
        "pinned staging memory: this weightcache was built without CUDA");
  }
  void Free(void*, uint64_t) override {}
};

}  // namespace

std::unique_ptr<StagingPool> MakePinnedStagingPool(uint64_t max_idle_bytes) {
  return std::make_unique<StagingPool>(std::make_unique<NoPinnedMemory>(), max_idle_bytes);
}

}  // namespace weightcache::load
