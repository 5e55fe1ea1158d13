#include "absl/strings/str_cat.h"
#include "pkg/memory/cuda_backend.h"
#include "pkg/util/log.h"

namespace weightcache::memory {

absl::StatusOr<std::unique_ptr<Backend>> MakeBackend(const std::string& name) {
  if (name == "host") return MakeHostBackend();
  if (name == "cuda" || name == "cuda-vmm") return MakeCudaBackend();
  if (name == "auto") {
    auto cuda = MakeCudaBackend();
    if (cuda.ok()) return cuda;
    WC_LOG_WARN("backend auto: CUDA not usable (%s); serving from host memory",
                std::string(cuda.status().message()));
    return MakeHostBackend();
  }
  return absl::InvalidArgumentError(
      absl::StrCat("backend '", name, "' is unknown (expected auto, host or cuda)"));
}

}  // namespace weightcache::memory
