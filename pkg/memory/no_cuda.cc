// Built only when the CUDA part is not: the degraded mode answers with a clear reason.
#include "absl/status/status.h"
#include "pkg/memory/cuda_backend.h"
#include "pkg/memory/internal/cuda_hooks.h"

namespace weightcache::memory {

bool BuiltWithCuda() { return false; }

std::string CudaVersionBuiltWith() { return "none"; }

absl::StatusOr<std::unique_ptr<Backend>> MakeCudaBackend(const CudaBackendOptions&) {
  return absl::UnimplementedError(
      "backend cuda: this weightcache was built without CUDA (configure with "
      "-DWEIGHTCACHE_CUDA=ON and nvcc available)");
}

namespace internal {
// NOLINTNEXTLINE(performance-unnecessary-value-param): the signature takes the FDs over
absl::StatusOr<std::unique_ptr<SegmentMapping>> MapCudaReadOnly(std::vector<ScopedFd>,
                                                                const std::vector<uint64_t>&,
                                                                const std::string&, MapTimings*) {
  return absl::UnimplementedError(
      "cuda-vmm segments: this client was built without CUDA and cannot map GPU memory");
}
// NOLINTNEXTLINE(performance-unnecessary-value-param): the signature takes the FDs over
absl::StatusOr<std::unique_ptr<SegmentMapping>> MapCudaWritable(std::vector<ScopedFd>,
                                                                const std::vector<uint64_t>&,
                                                                const std::string&) {
  return absl::UnimplementedError(
      "cuda-vmm segments: this client was built without CUDA and cannot map GPU memory");
}
absl::Status CopyCudaToHost(const std::string& device_uuid, const void*, size_t, void*) {
  return absl::UnimplementedError("reading GPU " + device_uuid +
                                  ": this weightcache was built without CUDA");
}
}  // namespace internal

}  // namespace weightcache::memory
