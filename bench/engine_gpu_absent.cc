// EngineGpu in a build without CUDA: says so.
#include "bench/engine.h"

namespace weightcache::bench {

struct EngineGpu::Context {};

EngineGpu::~EngineGpu() = default;

absl::StatusOr<std::unique_ptr<EngineGpu>> EngineGpu::Open() {
  return absl::UnimplementedError("this build has no CUDA: the cuda engine cannot run");
}

}  // namespace weightcache::bench
