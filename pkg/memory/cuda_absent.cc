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

}  // namespace weightcache::memory::internal
