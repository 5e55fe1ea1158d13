// The loader's GPU path (private to pkg/load): runs a scatter plan (scatter.h) into cuda-vmm
// segments through a ring of pinned staging buffers (from LoadOptions::staging_pool, or
// pinned for this load). Parallel preads (a safetensors::ReadQueue) fill the next buffers
// while the copies out of the earlier ones run: one stream per device of the group, each
// copy a cuMemcpy2DAsync from page-locked memory (a row-parallel shard's rows in one call;
// never a pageable copy); an event per buffer and device says when it may be refilled.
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
#include "pkg/load/scatter.h"
#include "pkg/memory/backend.h"

namespace weightcache::load::internal {

// segments[rank] must all be cuda-vmm segments (memory::internal::AsCudaSegment), not yet
// sealed; a rank's segments are on one device, ranks may share a device or not. Online
// fp8_block jobs get a device scratch per rank (ScatterPlan::scratch_bytes) and run the
// quantization kernel on the rank's device after their last copy. Progress: the bytes read
// and queued so far, after each buffer; the file name. `stats` (optional) receives the read
// and copy-wait times and the bytes read (O_DIRECT alignment included).
absl::Status ScatterThroughPinnedStaging(const ScatterPlan& plan,
                                         const std::vector<ScatterFile>& files,
                                         const std::vector<std::vector<memory::Segment*>>& segments,
                                         const LoadOptions& options, LoadProgress* progress,
                                         LoadStats* stats = nullptr);

}  // namespace weightcache::load::internal
