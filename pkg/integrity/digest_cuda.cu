// The digest kernel (digest.h's NH sum per 1 MiB chunk) and its host side. One block of 512
// threads per chunk; each thread sums 16-byte words strided by the block, then the block
// reduces with warp shuffles. Bandwidth-bound: on the H200 it reads at ~4.7 TB/s unthrottled
// (docs/benchmarks.md). Runs on a lowest-priority non-blocking stream, so a co-located
// engine's kernels are scheduled first; the pacer bounds the bytes per second on top.
#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "pkg/integrity/internal/digest_cuda.h"
#include "pkg/memory/internal/cuda_segment.h"

namespace weightcache::integrity::internal {
namespace {

constexpr int kThreads = 512;

__device__ __forceinline__ uint32_t DeviceKey(uint64_t i) {
  uint32_t x =
      static_cast<uint32_t>(i) * 0x9E3779B1u + static_cast<uint32_t>(i >> 32) * 0x85EBCA77u;
  return x ^ (x >> 15);
}

// Chunk c of the piece starting at segment byte `piece_offset` (`piece_bytes` long).
__global__ void DigestKernel(const uint4* __restrict__ piece, uint64_t piece_offset,
                             uint64_t piece_bytes, unsigned long long* __restrict__ out) {
  const uint64_t words_per_chunk = kChunkBytes / kWordBytes;
  const uint64_t first = static_cast<uint64_t>(blockIdx.x) * words_per_chunk;
  const uint64_t words = min(words_per_chunk, piece_bytes / kWordBytes - first);
  const uint4* c = piece + first;
  const uint64_t k0 = (piece_offset / kWordBytes + first) * 4;  // 32-bit word index
  unsigned long long acc = 0;
  for (uint64_t i = threadIdx.x; i < words; i += blockDim.x) {
    const uint4 v = c[i];
    const uint64_t k = k0 + i * 4;
    acc += static_cast<unsigned long long>(v.x + DeviceKey(k)) * (v.y + DeviceKey(k + 1)) +
           static_cast<unsigned long long>(v.z + DeviceKey(k + 2)) * (v.w + DeviceKey(k + 3));
  }
  for (int o = 16; o > 0; o >>= 1) acc += __shfl_down_sync(0xffffffffu, acc, o);
  __shared__ unsigned long long partial[kThreads / 32];
  if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = acc;
  __syncthreads();
  if (threadIdx.x < 32) {
    acc = threadIdx.x < (blockDim.x >> 5) ? partial[threadIdx.x] : 0;
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_down_sync(0xffffffffu, acc, o);
    if (threadIdx.x == 0) out[blockIdx.x] = acc;
  }
}

absl::Status Cuda(cudaError_t rc, const char* call, const std::string& where) {
  if (rc == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat(call, " (digest of ", where, "): ", cudaGetErrorString(rc)));
}

// The stream and result buffer of one digest, released on every path.
struct Resources {
  cudaStream_t stream = nullptr;
  unsigned long long* out = nullptr;
  ~Resources() {
    if (stream != nullptr) {
      cudaStreamSynchronize(stream);
      cudaStreamDestroy(stream);
    }
    if (out != nullptr) cudaFree(out);
  }
};

}  // namespace

absl::StatusOr<SegmentDigest> DigestDevice(const std::string& device_uuid,
                                           const std::byte* device_ptr, uint64_t size,
                                           const Pacer& pacer) {
  const std::string where = absl::StrCat(size, " bytes on ", device_uuid);
  auto ordinal = memory::internal::CudaOrdinalOfUuid(device_uuid);
  if (!ordinal.ok()) return ordinal.status();
  // The device's primary context: the one the read-only mapping was made in.
  if (auto st = Cuda(cudaSetDevice(*ordinal), "cudaSetDevice", where); !st.ok()) return st;
  int least = 0, greatest = 0;
  if (auto st = Cuda(cudaDeviceGetStreamPriorityRange(&least, &greatest),
                     "cudaDeviceGetStreamPriorityRange", where);
      !st.ok()) {
    return st;
  }
  Resources r;
  if (auto st = Cuda(cudaStreamCreateWithPriority(&r.stream, cudaStreamNonBlocking, least),
                     "cudaStreamCreateWithPriority", where);
      !st.ok()) {
    return st;
  }
  const size_t chunks = ChunkCount(size);
  if (auto st = Cuda(cudaMalloc(&r.out, chunks * sizeof(unsigned long long)), "cudaMalloc", where);
      !st.ok()) {
    return st;
  }
  for (uint64_t piece = 0; piece < size; piece += kPieceBytes) {
    if (auto st = pacer.Before(piece); !st.ok()) return st;
    const uint64_t n = std::min(kPieceBytes, size - piece);
    const unsigned blocks = static_cast<unsigned>((n + kChunkBytes - 1) / kChunkBytes);
    DigestKernel<<<blocks, kThreads, 0, r.stream>>>(
        reinterpret_cast<const uint4*>(device_ptr + piece), piece, n, r.out + piece / kChunkBytes);
    if (auto st = Cuda(cudaGetLastError(), "digest kernel launch", where); !st.ok()) return st;
    // One piece in flight at a time: the pacer's budget is what the GPU really read.
    if (auto st = Cuda(cudaStreamSynchronize(r.stream), "cudaStreamSynchronize", where); !st.ok()) {
      return st;
    }
  }
  SegmentDigest d;
  d.chunks.resize(chunks);
  // On the scrub stream itself: a non-blocking stream does not order with the legacy one.
  if (auto st = Cuda(cudaMemcpyAsync(d.chunks.data(), r.out, chunks * sizeof(uint64_t),
                                     cudaMemcpyDeviceToHost, r.stream),
                     "cudaMemcpyAsync", where);
      !st.ok()) {
    return st;
  }
  if (auto st = Cuda(cudaStreamSynchronize(r.stream), "cudaStreamSynchronize", where); !st.ok()) {
    return st;
  }
  return d;
}

}  // namespace weightcache::integrity::internal
