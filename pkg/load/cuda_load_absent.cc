// Built only without CUDA: no cuda-vmm segment can exist, so the GPU path is never taken.
#include "pkg/load/internal/cuda_load.h"

namespace weightcache::load::internal {

absl::Status CopyThroughPinnedStaging(const std::vector<CopyRange>&, const std::vector<QuantJob>&,
                                      const std::vector<memory::Segment*>&, const LoadOptions&,
                                      LoadProgress*, LoadStats*) {
  return absl::UnimplementedError(
      "loading into GPU memory: this weightcache was built without CUDA");
}

}  // namespace weightcache::load::internal
