// Reading a planned tensor whose source is not one contiguous range (plan.h: Piece): the
// row-parallel shards of tensor parallelism and padded vocabulary shards. Helpers for the
// loader's paths; they own nothing and keep no state.
// Thread-safety: free functions; safe from any thread on distinct destinations.
#pragma once

#include <cstdint>
#include <functional>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "pkg/load/plan.h"
#include "pkg/safetensors/safetensors.h"

namespace weightcache::load {

// A contiguous copy: `length` bytes from `file_offset` to byte `dst_offset` of the tensor.
struct Run {
  uint64_t file_offset = 0;
  uint64_t length = 0;
  uint64_t dst_offset = 0;
};

// Online-quantized tensors (PlannedTensor::quant): every helper below works in SOURCE bytes
// (the BF16/F16 shard, SourceBytes(t) of them), for a source-sized scratch destination, not
// the tensor's fp8 bytes. Scale tensors written by a quantization (scale_of set) have no
// runs and no source bytes.
uint64_t SourceBytes(const PlannedTensor& t);

// Calls `fn` for each contiguous run of `t`, in destination order: the whole tensor when it
// has no pieces, else each row of each piece (rows that are adjacent in the file too are
// merged into one run). Empty runs are skipped.
void ForEachRun(const PlannedTensor& t, const std::function<void(const Run&)>& fn);

// Appends the ReadRequests that fill `t` at host address `dst` (t.nbytes bytes): the one
// change the direct (host-addressable) loader path needs:
//   reqs.push_back({fd, t->file_offset, t->nbytes, dst, what});
// becomes
//   AppendReadRequests(*t, fd, dst, what, &reqs);
// Bytes of `t` that no run covers (PaddingRanges) are not written: the destination must
// already be zero there (memfd segments are).
void AppendReadRequests(const PlannedTensor& t, int fd, void* dst, std::string_view what,
                        std::vector<safetensors::ReadRequest>* reqs);

// The requests of several files (one list each, in file order) as one list where up to
// `width` files take turns: each request cut into reads of at most `chunk` bytes, one read of
// each file in turn, the next file joining when one ends. A load whose pinned digests follow
// its reads (one hasher per file) reads files side by side this way; `width` 1 keeps the files
// one after another.
std::vector<safetensors::ReadRequest> FilesInTurn(
    const std::vector<std::vector<safetensors::ReadRequest>>& by_file, size_t width,
    uint64_t chunk);

// [begin, end) source byte ranges of `t` that no piece covers: zero padding. Empty for tensors
// without pieces.
std::vector<std::pair<uint64_t, uint64_t>> PaddingRanges(const PlannedTensor& t);

// Reads all of `t` into `dst` (SourceBytes(t) bytes of host memory) and zeroes its padding. For a
// strided piece whose rows are small (< `gather_below` bytes), reads the piece's covering
// range once into a bounded scratch buffer and gathers the rows, instead of one pread per
// row. For tests, staging paths and tools.
absl::Status ReadPlannedTensor(const PlannedTensor& t, int fd, void* dst, std::string_view what,
                               const safetensors::ReadOptions& options = {},
                               uint64_t gather_below = 64 << 10);

}  // namespace weightcache::load
