// The digest kernel (digest.h's NH sum per 1 MiB chunk) and its host side. One block of 512
// threads per chunk; each thread sums 16-byte words strided by the block, then the block
// reduces with warp shuffles. Bandwidth-bound (bench/scrub_bench.cu measures it; figures in
// docs/benchmarks.md). Runs on a lowest-priority non-blocking stream, so a co-located
// engine's kernels are scheduled first; the pacer bounds the bytes per second on top.
// Streams and result buffers are pooled per device (ResourcePool), not made per call.
#include <cuda_runtime.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <vector>

#include "absl/strings/str_cat.h"
#include "pkg/integrity/internal/digest_cuda.h"
#include "pkg/memory/internal/cuda_segment.h"

namespace weightcache::integrity::internal {
namespace {

constexpr int kThreads = 512;
// Unthrottled, a launch covers up to this many bytes: 1024 blocks, several per SM.
constexpr uint64_t kSpanBytes = 1ull << 30;

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

// A stream and a result buffer on one device, reused by digest after digest (creating a
// stream and a buffer per call, and the cudaFree that synchronizes the device, cost more than
// digesting a GiB). Kept for the process's life: freeing them at exit would call into a
// driver that may already be gone.
struct Resources {
  cudaStream_t stream = nullptr;
  unsigned long long* out = nullptr;
  size_t capacity = 0;  // chunks `out` holds
};

// Idle Resources per device ordinal: a digest takes one (or makes one) and gives it back, so
// digests on one device at once (a fill and the scrubber) each have their own stream.
class ResourcePool {
 public:
  static ResourcePool& Get() {
    static ResourcePool* pool = new ResourcePool();  // never destroyed (see above)
    return *pool;
  }
  Resources* Take(int ordinal) {
    std::lock_guard<std::mutex> l(mu_);
    auto& idle = idle_[ordinal];
    if (idle.empty()) return new Resources();
    Resources* r = idle.back();
    idle.pop_back();
    return r;
  }
  void Give(int ordinal, Resources* r) {
    std::lock_guard<std::mutex> l(mu_);
    idle_[ordinal].push_back(r);
  }

 private:
  std::mutex mu_;
  std::map<int, std::vector<Resources*>> idle_;
};

// One digest's hold on a device's Resources: on every path, waits for what it queued (a
// stopped digest must not leave kernels writing into a buffer the next one uses), then gives
// them back.
class Lent {
 public:
  explicit Lent(int ordinal) : ordinal_(ordinal), r_(ResourcePool::Get().Take(ordinal)) {}
  ~Lent() {
    if (r_->stream != nullptr) cudaStreamSynchronize(r_->stream);
    ResourcePool::Get().Give(ordinal_, r_);
  }
  Lent(const Lent&) = delete;
  Lent& operator=(const Lent&) = delete;
  Resources* operator->() const { return r_; }

 private:
  const int ordinal_;
  Resources* const r_;
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
  Lent r(*ordinal);
  if (r->stream == nullptr) {
    if (auto st = Cuda(cudaStreamCreateWithPriority(&r->stream, cudaStreamNonBlocking, least),
                       "cudaStreamCreateWithPriority", where);
        !st.ok()) {
      return st;
    }
  }
  const size_t chunks = ChunkCount(size);
  if (r->capacity < chunks) {
    if (r->out != nullptr) {
      cudaStreamSynchronize(r->stream);
      cudaFree(r->out);
      r->out = nullptr;
      r->capacity = 0;
    }
    if (auto st =
            Cuda(cudaMalloc(&r->out, chunks * sizeof(unsigned long long)), "cudaMalloc", where);
        !st.ok()) {
      return st;
    }
    r->capacity = chunks;
  }
  // Throttled: one kPieceBytes piece in flight at a time, so the pacer's budget is what the
  // GPU really read. Unthrottled: spans of up to kSpanBytes queued back to back (a 64 MiB
  // piece is only 64 blocks, half the H200's SMs, and a synchronization per piece cost as
  // much as its kernel), the stop asked between spans.
  const bool throttled = pacer.throttled();
  const uint64_t step = throttled ? kPieceBytes : kSpanBytes;
  for (uint64_t piece = 0; piece < size; piece += step) {
    if (auto st = pacer.Before(piece); !st.ok()) return st;
    const uint64_t n = std::min(step, size - piece);
    const unsigned blocks = static_cast<unsigned>((n + kChunkBytes - 1) / kChunkBytes);
    DigestKernel<<<blocks, kThreads, 0, r->stream>>>(
        reinterpret_cast<const uint4*>(device_ptr + piece), piece, n, r->out + piece / kChunkBytes);
    if (auto st = Cuda(cudaGetLastError(), "digest kernel launch", where); !st.ok()) return st;
    if (throttled) {
      if (auto st = Cuda(cudaStreamSynchronize(r->stream), "cudaStreamSynchronize", where);
          !st.ok()) {
        return st;
      }
    }
  }
  SegmentDigest d;
  d.chunks.resize(chunks);
  // On the scrub stream itself: a non-blocking stream does not order with the legacy one.
  if (auto st = Cuda(cudaMemcpyAsync(d.chunks.data(), r->out, chunks * sizeof(uint64_t),
                                     cudaMemcpyDeviceToHost, r->stream),
                     "cudaMemcpyAsync", where);
      !st.ok()) {
    return st;
  }
  if (auto st = Cuda(cudaStreamSynchronize(r->stream), "cudaStreamSynchronize", where); !st.ok()) {
    return st;
  }
  return d;
}

}  // namespace weightcache::integrity::internal
