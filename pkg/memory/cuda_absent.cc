// Built only without CUDA (see cuda.cmake): the loader/client extras of internal/cuda_segment.h
// answer that this build has no GPU support, like no_cuda.cc does for the public entry points.
#include "absl/status/status.h"
#include "pkg/memory/internal/cuda_segment.h"

namespace weightcache::memory::internal {

CudaSegment* AsCudaSegment(Segment*) { return nullptr; }

absl::StatusOr<int> CudaOrdinalOfUuid(const std::string& device_uuid) {
  return absl::UnimplementedError("GPU " + device_uuid +
                                  ": this weightcache was built without CUDA");
}

// NOLINTNEXTLINE(performance-unnecessary-value-param): the signature takes the FDs over
absl::StatusOr<std::unique_ptr<SegmentMapping>> MapCudaReadOnlyTimed(std::vector<ScopedFd>,
                                                                     const std::vector<uint64_t>&,
                                                                     const std::string&,
                                                                     MapTimings*) {
  return absl::UnimplementedError(
      "cuda-vmm segments: this client was built without CUDA and cannot map GPU memory");
}

}  // namespace weightcache::memory::internal
