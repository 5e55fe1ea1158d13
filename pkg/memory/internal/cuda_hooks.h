// The seam between the backend-neutral code of pkg/memory and its CUDA part. When the
// build has no CUDA (WEIGHTCACHE_CUDA=OFF or no nvcc), no_cuda.cc defines these to answer
// a clear "built without CUDA" error, so the host paths work unchanged.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "pkg/memory/backend.h"
#include "pkg/memory/mapping.h"

namespace weightcache::memory::internal {

// `timings` (optional) receives the stages (mapping.h: MapTimings).
absl::StatusOr<std::unique_ptr<SegmentMapping>> MapCudaReadOnly(std::vector<ScopedFd> fds,
                                                                const std::vector<uint64_t>& sizes,
                                                                const std::string& device_uuid,
                                                                MapTimings* timings = nullptr);

// The same mapping with read-write access (a publisher's segments); its destructor
// synchronizes the context before unmapping.
absl::StatusOr<std::unique_ptr<SegmentMapping>> MapCudaWritable(std::vector<ScopedFd> fds,
                                                                const std::vector<uint64_t>& sizes,
                                                                const std::string& device_uuid);

// cuMemcpyDtoH of n bytes at device address `src` on `device_uuid` into `dst`.
absl::Status CopyCudaToHost(const std::string& device_uuid, const void* src, size_t n, void* dst);

}  // namespace weightcache::memory::internal
