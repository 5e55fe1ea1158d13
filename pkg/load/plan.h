// The load plan of one model-rank: where every tensor lands. Tensors are packed into few
// large segments (each at most the backend's max segment size, unless one tensor alone is
// larger), each tensor at an aligned offset, so mapping costs O(segments), not O(tensors).
// Thread-safety: plain values.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "pkg/load/model.h"
#include "pkg/spec/fingerprint.h"

namespace weightcache::load {

struct PlannedTensor {
  std::string name;
  safetensors::DType dtype = safetensors::DType::kU8;
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;  // elements, row-major
  uint32_t segment = 0;
  uint64_t offset = 0;  // in the segment
  uint64_t nbytes = 0;
  // Source bytes.
  size_t file_index = 0;
  uint64_t file_offset = 0;
};

struct Plan {
  std::vector<uint64_t> segment_bytes;  // used bytes per segment (before rounding)
  std::vector<PlannedTensor> tensors;   // in checkpoint name order
  uint64_t total_bytes = 0;             // sum of tensor bytes
};

struct PlanOptions {
  uint64_t alignment = 256;
  uint64_t max_segment_bytes = 1ull << 30;
};

// Plans `layout` of `model`. This build serves checkpoints as stored: tp_size and pp_size
// 1; other layouts are UNIMPLEMENTED with that reason.
absl::StatusOr<Plan> PlanRank(const OpenedModel& model, const spec::Layout& layout,
                              const PlanOptions& options);

}  // namespace weightcache::load
