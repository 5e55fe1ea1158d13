// Online fp8_block on the CPU, shared by the loader's host paths (loader.cc, scatter_host.cc;
// private to pkg/load).
#pragma once

#include <cstdint>
#include <string_view>

#include "absl/status/status.h"
#include "pkg/load/plan.h"
#include "pkg/memory/backend.h"

namespace weightcache::load::internal {

// Quantizes `src`, the BF16/F16 source shard of the online-quantized tensor `t`
// (SourceBytes(t) bytes, row-major [t.shape[0], t.shape[1]]), with up to `threads` threads
// (whole block rows each: the result equals one QuantizeFp8Block call), and writes the fp8
// codes at t.offset of `wseg` and the block scales at scale.offset of `sseg` (straight into
// host-addressable segments, through CopyIn otherwise). Errors name `what`.
absl::Status QuantizeIntoSegments(const PlannedTensor& t, const PlannedTensor& scale,
                                  const uint8_t* src, memory::Segment& wseg, memory::Segment& sseg,
                                  unsigned threads, std::string_view what);

}  // namespace weightcache::load::internal
