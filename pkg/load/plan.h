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
#include <optional>
#include <string>
#include <string_view>
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

// Online block-FP8 quantization of one weight (spec `quantization: fp8_block` on a BF16/F16
// checkpoint): the loader reads this rank's BF16/F16 shard (the tensor's source fields
// describe those bytes: `src_nbytes` of them, pieces' dst_offset in source bytes), quantizes
// it with 128x128 blocks from the shard's own (0, 0) corner (QuantizeFp8Block, fp8_quant.h;
// the GPU kernel on cuda-vmm) into the tensor's F8_E4M3 bytes, and writes the block scales
// into the planned tensor named `scale`.
struct OnlineQuant {
  safetensors::DType src_dtype = safetensors::DType::kBF16;  // BF16 or F16
  uint64_t src_nbytes = 0;
  int block_rows = 128;
  int block_cols = 128;
  std::string scale;  // name of the F32 <x>.weight_scale_inv planned tensor
  bool operator==(const OnlineQuant&) const = default;
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
  // Set when the loader quantizes this tensor online: `dtype` is then F8_E4M3 and `nbytes`
  // the fp8 bytes, while the source fields above describe the BF16/F16 shard.
  std::optional<OnlineQuant> quant;
  // Non-empty for an online quantization's scale tensor: the name of the weight whose
  // quantization writes it. Such a tensor has no source in any file and is never read.
  std::string scale_of;
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

// Online fp8_block (OpenedModel::quantization.online): which tensors are quantized. As the
// engines do it (SGLang / vLLM Fp8LinearMethod and Fp8MoEMethod act on linear layers and
// fused MoE experts only): 2-D `<module>.weight` whose last module component is one of
// q_proj k_proj v_proj o_proj qkv_proj gate_proj up_proj down_proj gate_up_proj w1 w2 w3
// (Mixtral experts) q_a_proj q_b_proj kv_a_proj_with_mqa kv_b_proj (DeepSeek MLA), i.e. the
// attention and MLP projections and every expert's. Everything else stays as stored:
// embeddings, lm_head (ParallelLMHead is never fp8 in either engine), norms, router gates
// (mlp.gate, block_sparse_moe.gate, shared_expert_gate: created without a quant config),
// biases, MTP eh_proj, e_score_correction_bias. Rule "linear-v1" in the fingerprint.
bool IsOnlineQuantized(std::string_view tensor_name);

// Plans `layout` of `model` (the spec's `layout` picks the engine layout). Errors:
// UNIMPLEMENTED for pp_size > 1, an architecture without a sharding preset or a tensor no
// rule covers (when tp_size > 1 or the layout is not hf), and pieces the loader cannot read;
// INVALID_ARGUMENT naming the tensor, dimension and sizes for a tp_size that does not divide
// the heads or a dimension, or a split that is not on a block-FP8 block boundary.
// Online fp8_block: each quantized weight becomes an F8_E4M3 tensor of its shard's shape
// plus an F32 `<module>.weight_scale_inv` of [ceil(rows/128), ceil(cols/128)] placed after
// it; the shard is quantized after splitting (per shard, from its own corner, as an engine
// quantizes the shard it loaded), so no split needs to fall on a block boundary. A fused
// view's scale (layout sglang|vllm) still needs every member but the last to hold whole
// 128-row blocks on the rank (else INVALID_ARGUMENT naming it: the engine would quantize
// the fused shard across member boundaries). A quantized weight that is not 2-D BF16/F16,
// or a checkpoint that already has `.weight_scale_inv` tensors, is INVALID_ARGUMENT.
absl::StatusOr<Plan> PlanRank(const OpenedModel& model, const spec::Layout& layout,
                              const PlanOptions& options);

// The part of `plan` that lands in the segments `wanted` marks (one flag per segment of
// `plan`), as a plan of its own for LoadRank: those segments renumbered in order (their
// sizes kept), the tensors placed in them at the same offsets in the same order, no views
// (a view is never read). `wanted` is first widened so that a load of the part writes no
// other segment: an online-quantized weight and its scale tensor, when they sit in two
// segments, are wanted together. `segments[j]` is the index in `plan` of the part's segment j.
// A peer fill that filled some segments loads the rest from disk with it (admission.cc).
struct PlanPart {
  Plan plan;
  std::vector<uint32_t> segments;
};
PlanPart PlanSegments(const Plan& plan, std::vector<bool> wanted);

}  // namespace weightcache::load
