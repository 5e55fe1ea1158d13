// The load plan of one model-rank: where every tensor lands. Tensors are packed into few
// large segments (each at most the backend's max segment size, unless one tensor alone is
// larger), each tensor at an aligned offset, so mapping costs O(segments), not O(tensors).
//
// Tensor parallelism (tp_size > 1) follows the architecture's sharding preset
// (shard_rules.h): each PlannedTensor is this rank's shard, with the shape the engine's rank
// holds (q_proj on rank r of tp 4: [out/4, in]). Engine layouts (spec `layout: sglang|vllm`)
// also place the members of each fused group (q/k/v, gate/up, and their biases and scales)
// back to back and add the fused tensor as a view aliasing them (Plan::views).
//
// tp_size 1 with layout hf plans every tensor whole, in checkpoint name order, exactly as
// before sharding existed (any architecture, no preset needed): same bytes, same manifest.
// Thread-safety: plain values.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "pkg/load/model.h"
#include "pkg/spec/fingerprint.h"

namespace weightcache::load {

// A 2-D strided copy from a source file into a planned tensor: `rows` runs of `row_bytes`,
// source runs `src_pitch` bytes apart starting at `file_offset`, packed one after another in
// the tensor starting at `dst_offset` (relative to the tensor's first byte). A row-parallel
// shard of a row-major [out, in] weight is one piece: out rows of in/tp elements.
struct Piece {
  uint64_t file_offset = 0;
  uint64_t dst_offset = 0;
  uint64_t row_bytes = 0;
  uint64_t rows = 1;
  uint64_t src_pitch = 0;  // >= row_bytes when rows > 1

  uint64_t bytes() const { return row_bytes * rows; }
  // One past the last source byte.
  uint64_t file_end() const {
    return rows == 0 ? file_offset : file_offset + (rows - 1) * src_pitch + row_bytes;
  }
  bool operator==(const Piece&) const = default;
};

struct PlannedTensor {
  std::string name;
  safetensors::DType dtype = safetensors::DType::kU8;
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;  // elements, row-major
  uint32_t segment = 0;
  uint64_t offset = 0;  // in the segment
  uint64_t nbytes = 0;
  // Source bytes. With `pieces` empty (every tensor at tp_size 1, replicated and
  // column-parallel shards) the tensor is the contiguous range [file_offset,
  // file_offset + nbytes) of file `file_index`. Otherwise only the pieces are read and every
  // byte of the tensor no piece covers is zero (vocabulary padding); file_offset is then the
  // first source byte, for ordering reads.
  size_t file_index = 0;
  uint64_t file_offset = 0;
  std::vector<Piece> pieces;
};

struct Plan {
  std::vector<uint64_t> segment_bytes;  // used bytes per segment (before rounding)
  std::vector<PlannedTensor> tensors;   // in name order; what the loader reads
  uint64_t total_bytes = 0;             // sum of tensor bytes
  // Fused views (engine layouts): extra manifest entries aliasing bytes of `tensors`
  // (segment, offset, nbytes, shape, strides set; no source). Never read from a file. In
  // name order.
  std::vector<PlannedTensor> views;
};

struct PlanOptions {
  uint64_t alignment = 256;
  uint64_t max_segment_bytes = 1ull << 30;
  // Whether the caller's loader honours PlannedTensor::pieces (strided row-parallel shards,
  // vocabulary padding). When false, a plan that needs pieces is refused (UNIMPLEMENTED)
  // rather than loaded as wrong bytes.
  bool loader_reads_pieces = false;
};

// Plans `layout` of `model` (the spec's `layout` picks the engine layout). Errors:
// UNIMPLEMENTED for pp_size > 1, an architecture without a sharding preset or a tensor no
// rule covers (when tp_size > 1 or the layout is not hf), and pieces the loader cannot read;
// INVALID_ARGUMENT naming the tensor, dimension and sizes for a tp_size that does not divide
// the heads or a dimension, or a split that is not on a block-FP8 block boundary.
absl::StatusOr<Plan> PlanRank(const OpenedModel& model, const spec::Layout& layout,
                              const PlanOptions& options);

}  // namespace weightcache::load
