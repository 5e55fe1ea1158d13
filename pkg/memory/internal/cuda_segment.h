// Loader- and client-facing extras of the cuda-vmm backend, beyond the Segment /
// SegmentMapping interfaces: the device pointer of a segment being filled, an asynchronous
// copy from pinned host memory on a stream, and the CUDA ordinal of a device UUID.
//
// Deliberately free of CUDA headers (streams are passed as the opaque CUstream_st*, which is
// both CUstream and cudaStream_t), so code built without CUDA may include it; these
// functions then answer UNIMPLEMENTED / null.
//
// Thread-safety and lifetimes as in backend.h: a CudaSegment is filled from any threads on
// disjoint ranges, then Seal()ed once; the device pointer is valid until Seal.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "pkg/memory/backend.h"
#include "pkg/memory/mapping.h"

struct CUstream_st;

namespace weightcache::memory::internal {

class CudaSegment : public Segment {
 public:
  // The daemon's read-write device mapping of the segment; null after Seal (Seal drops it).
  virtual void* device_ptr() = 0;
  // CUDA ordinal (in this process) of the device that holds the memory.
  virtual int device_ordinal() const = 0;
  // Queues a host->device copy of `n` bytes from `src` to `offset` on `stream` (a stream of
  // this device's primary context; null = the legacy default stream). `src` should be pinned
  // (cudaHostAlloc / cuMemHostRegister) for the copy to be asynchronous, and must stay valid
  // until the stream reaches the copy. Seal() waits for every queued copy.
  virtual absl::Status CopyInAsync(uint64_t offset, const void* src, size_t n,
                                   CUstream_st* stream) = 0;
};

// The CUDA view of a segment, or null when `s` is not a cuda-vmm segment.
CudaSegment* AsCudaSegment(Segment* s);

// The CUDA ordinal, in this process, of the device with this UUID (e.g. to build the
// torch::Device "cuda:N" of a mapping, or for cudaSetDevice). NOT_FOUND when not visible.
absl::StatusOr<int> CudaOrdinalOfUuid(const std::string& device_uuid);

}  // namespace weightcache::memory::internal
