// The loader's GPU path (private to pkg/load): file byte ranges -> cuda-vmm segments through
// a ring of pinned staging buffers (from LoadOptions::staging_pool, or pinned for this load).
// Parallel preads (a safetensors::ReadQueue) fill the next buffers while the copies of the
// earlier ones run on a stream (cuMemcpyHtoDAsync from page-locked memory; never a pageable
// copy); an event per buffer says when it may be refilled.
//
// Free of CUDA headers; cuda_load.cc implements it in CUDA builds, cuda_load_absent.cc
// answers UNIMPLEMENTED otherwise (the loader only calls it for cuda-vmm segments, which a
// build without CUDA cannot allocate). Called from the loading thread; blocks until every
// copy has landed (or failed).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "pkg/load/loader.h"
#include "pkg/memory/backend.h"
#include "pkg/safetensors/safetensors.h"

namespace weightcache::load::internal {

// `n` bytes at `file_offset` of `fd` land at `segment_offset` of segments[segment].
struct CopyRange {
  int fd = -1;
  uint64_t file_offset = 0;
  uint64_t n = 0;
  uint32_t segment = 0;
  uint64_t segment_offset = 0;
  std::string what;  // for errors: "model.safetensors: tensor 'x'"
  std::string file;  // for progress: the file name
  // >= 0: the bytes belong to the source shard of quantization job `quant` and land at
  // `segment_offset` of that job's device scratch, not in a segment.
  int32_t quant = -1;
  // >= 0: the same file opened with O_DIRECT; the ring then reads whole 4 KiB-aligned spans
  // through it (the unaligned tail before end of file through `fd`). file_size bounds them.
  int direct_fd = -1;
  uint64_t file_size = 0;
};

// Online fp8_block of one tensor: once every range of the job has been copied into device
// scratch, a kernel (fp8_quant.cu) quantizes the [rows, cols] BF16/F16 shard into the fp8
// bytes at fp8_offset of segments[fp8_segment] and the scales at scale_offset of
// segments[scale_segment]. The ranges of one job must be consecutive in `ranges`.
struct QuantJob {
  uint32_t fp8_segment = 0;
  uint64_t fp8_offset = 0;
  uint32_t scale_segment = 0;
  uint64_t scale_offset = 0;
  safetensors::DType src_dtype = safetensors::DType::kBF16;
  int64_t rows = 0;
  int64_t cols = 0;
  int block_rows = 128;
  int block_cols = 128;
  uint64_t src_nbytes = 0;
  std::string what;
};

// Every segment must be a cuda-vmm segment (memory::internal::AsCudaSegment) of one device,
// not yet sealed. Ranges are read in the order given (keep them sequential per file).
// Progress: the bytes of `ranges` read and queued so far, after each buffer; the file name.
// `stats` (optional) receives the read and copy-wait times and the bytes read.
absl::Status CopyThroughPinnedStaging(const std::vector<CopyRange>& ranges,
                                      const std::vector<QuantJob>& jobs,
                                      const std::vector<memory::Segment*>& segments,
                                      const LoadOptions& options, LoadProgress* progress,
                                      LoadStats* stats = nullptr);

}  // namespace weightcache::load::internal
