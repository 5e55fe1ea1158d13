// The cuda-vmm backend (see backend.h). Driver entry points are fetched at run time, so
// the same binary starts on a machine with no GPU: then MakeCudaBackend answers
// FAILED_PRECONDITION with the reason, and `auto` selection falls back to host.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "pkg/memory/backend.h"

namespace weightcache::memory {

struct CudaBackendOptions {
  uint64_t max_segment_bytes = 2ull << 30;
};

// UNIMPLEMENTED when built without CUDA; FAILED_PRECONDITION when no usable device.
absl::StatusOr<std::unique_ptr<Backend>> MakeCudaBackend(const CudaBackendOptions& options = {});

// "auto" | "host" | "cuda": auto picks CUDA when a device is usable, else host (logged).
absl::StatusOr<std::unique_ptr<Backend>> MakeBackend(const std::string& name);

// True when this binary was built with the CUDA backend.
bool BuiltWithCuda();

// The CUDA version this binary was built against ("13.0", "11.8"), or "none".
std::string CudaVersionBuiltWith();

}  // namespace weightcache::memory
