// Reading a checkpoint once for several ranks: the scatter plan.
//
// A tensor-parallel group (the ranks of one layout, on one GPU or several) needs, between
// them, every byte of most tensors: column-parallel shards are disjoint row ranges,
// row-parallel shards (o_proj, down_proj) are disjoint column ranges of every row, and
// replicated tensors (norms) are wanted whole by every rank. Loading the ranks one by one
// reads replicated tensors N times and reads row-parallel shards as one small strided run
// per row. The scatter plan instead reads each needed file range ONCE, sequentially, into
// staging buffers, and copies each buffer out to every rank that needs part of it: a
// rank's rows of a row-parallel shard as ONE 2-D strided copy (width = the shard's row,
// source pitch = the checkpoint's row, destination packed), never row by row.
//
// The plan is pure arithmetic over the ranks' load plans (plan.h); two executors run it:
// the host one below (memcpy into host-addressable segments, CopyIn otherwise, online fp8
// on the CPU) and the GPU one (internal/cuda_load.h: pinned ring, cuMemcpy2DAsync, the
// quantization kernel). They copy the same bytes to the same places, which is what the
// tests compare where there is no GPU.
//
// Thread-safety: plain values and free functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "pkg/load/loader.h"
#include "pkg/load/plan.h"
#include "pkg/memory/backend.h"

namespace weightcache::load {

// `height` rows of `width` bytes, `src_pitch` apart in the staging buffer starting at byte
// `src`, packed one after another (`width` apart) from byte `dst` of the destination: the
// rank's segment `segment`, or, when `quant` >= 0, the source-shard scratch of that
// quantization job (ScatterPlan::jobs). height 1 is a plain contiguous copy.
struct ScatterCopy {
  uint32_t rank = 0;  // index in the group (the plans given to PlanScatter)
  uint32_t segment = 0;
  uint64_t dst = 0;
  uint64_t src = 0;
  uint64_t width = 0;
  uint64_t height = 1;
  uint64_t src_pitch = 0;  // >= width
  int32_t quant = -1;
  bool finishes = false;  // the job's last copy: its source shard is complete after it

  uint64_t bytes() const { return width * height; }
  bool operator==(const ScatterCopy&) const = default;
};

// `length` consecutive bytes of checkpoint file `file` from `file_offset`, read into the
// buffer at byte `at`. at % align == file_offset % align, so an O_DIRECT read of the aligned
// span around it lands in place (the buffer leaves room up to the aligned end).
struct ScatterSpan {
  size_t file = 0;
  uint64_t file_offset = 0;
  uint64_t length = 0;
  uint64_t at = 0;
  bool operator==(const ScatterSpan&) const = default;
};

// One fill of a staging buffer: its reads, then its copies (in order).
struct ScatterBuffer {
  std::vector<ScatterSpan> spans;
  std::vector<ScatterCopy> copies;
  uint64_t read_bytes = 0;  // sum of span lengths
  bool operator==(const ScatterBuffer&) const = default;
};

// Online fp8_block of one rank's tensor: the copies marked with its index assemble the
// BF16/F16 source shard (SourceBytes(*tensor) bytes) in scratch; after the one marked
// `finishes`, it is quantized into `tensor` and `scale` of the rank's segments.
struct ScatterJob {
  uint32_t rank = 0;
  const PlannedTensor* tensor = nullptr;  // in the rank's plan
  const PlannedTensor* scale = nullptr;
};

struct ScatterPlan {
  uint64_t buffer_bytes = 0;
  uint64_t align = 0;
  std::vector<ScatterBuffer> buffers;
  std::vector<ScatterJob> jobs;
  // Per rank: the largest source shard among its jobs (its scratch size; 0 = no job). A
  // rank's jobs complete in order, so one scratch per rank is enough.
  std::vector<uint64_t> scratch_bytes;
  uint64_t read_bytes = 0;  // every span: what the load reads from the files
  uint64_t copy_bytes = 0;  // every copy: what lands in the ranks (and scratch)
};

struct ScatterOptions {
  uint64_t buffer_bytes = 64ull << 20;  // a multiple of align
  uint64_t align = 4096;                // O_DIRECT alignment of spans in the buffer
  // A strided piece whose rows are at least this long is read row by row (only the bytes
  // the group needs) rather than as the covering range with the other ranks' columns in
  // between. Only matters when the group lacks some ranks: with all of them, the covering
  // ranges of the ranks' pieces are the same bytes and are read once either way.
  uint64_t read_rows_above = 64ull << 10;
  // Buffers of up to this many files taken in turn (one buffer of each, round robin; the
  // next file joins when one is done) instead of file after file. A pinned load (issue 58)
  // hashes each file sequentially as it is read: files read side by side are hashed side by
  // side. 1: file order. Plans with online quantization keep file order (a rank's jobs share
  // one scratch and complete in order).
  size_t interleave_files = 1;
};

// Plans reading every byte the `plans` (the group's ranks, each planned by PlanRank for the
// same opened model) need, once, and copying it to each rank. The pointers must outlive
// the result (jobs point into them). INTERNAL for a plan that does not fit its own
// invariants (an online-quantized tensor without its scale tensor).
absl::StatusOr<ScatterPlan> PlanScatter(const std::vector<const Plan*>& plans,
                                        const ScatterOptions& options = {});

// A checkpoint file as the executors read it: `fd` through the page cache; `direct_fd`
// (>= 0) the same file opened with O_DIRECT, through which the GPU executor reads whole
// aligned spans (the unaligned tail before end of file through `fd`).
struct ScatterFile {
  int fd = -1;
  int direct_fd = -1;
  uint64_t size = 0;
  std::string name;  // for errors and progress
};

// Runs `plan` into host memory: each buffer's spans are read by parallel preads (the next
// buffer's while this one is copied out), then its copies land in `segments[rank]` (memcpy
// into host-addressable segments, CopyIn otherwise) and finished quantization jobs are
// quantized on the CPU. `files` is indexed by ScatterSpan::file. Segments are not sealed.
// `progress` counts bytes read against plan.read_bytes; cancellation stops it at the next
// read chunk with CANCELLED.
absl::Status ScatterOnHost(const ScatterPlan& plan, const std::vector<ScatterFile>& files,
                           const std::vector<std::vector<memory::Segment*>>& segments,
                           const LoadOptions& options, LoadProgress* progress, LoadStats* stats);

// The quantization job's scale tensor in `plan`; INTERNAL when the plan lacks one of the
// tensor's block grid.
absl::StatusOr<const PlannedTensor*> ScaleTensorOf(const Plan& plan, const PlannedTensor& t);

}  // namespace weightcache::load
