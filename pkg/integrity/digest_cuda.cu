// The digest kernels and their host side.
//  - NH (digest.h) per 1 MiB chunk under the process's key, which is copied to each device
//    once (1 MiB: every chunk reads the same table, which stays in L2). One block of 512
//    threads per chunk; each thread sums 16-byte words strided by the block, then the block
//    reduces with warp shuffles. Bandwidth-bound.
//  - sha256-tree (crypto_digest.h), only when asked (fills): one block of 64 threads per
//    chunk, a thread per 16 KiB leaf, then the block's thread 0 hashes the chunk's leaf
//    values; the host hashes the chunk values into the root. Compute-bound.
// bench/scrub_bench.cu measures both (figures in docs/benchmarks.md). They run on a
// lowest-priority non-blocking stream, so a co-located engine's kernels are scheduled
// first; the pacer bounds the bytes per second on top. Streams, result buffers and key
// copies are pooled per device (ResourcePool), not made per call.
#include <cuda_runtime.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "pkg/integrity/crypto_digest.h"
#include "pkg/integrity/internal/digest_cuda.h"
#include "pkg/memory/internal/cuda_segment.h"

namespace weightcache::integrity::internal {
namespace {

constexpr int kThreads = 512;
// Unthrottled, a launch covers up to this many bytes: 1024 blocks, several per SM.
constexpr uint64_t kSpanBytes = 1ull << 30;

// Chunk blockIdx.x of a piece (`piece_bytes` long, starting at a chunk boundary); `key` holds
// the 16-byte word keys of a chunk (ScrubKey::words as uint4).
__global__ void DigestKernel(const uint4* __restrict__ piece, uint64_t piece_bytes,
                             const uint4* __restrict__ key, unsigned long long* __restrict__ out) {
  const uint64_t words_per_chunk = kChunkBytes / kWordBytes;
  const uint64_t first = static_cast<uint64_t>(blockIdx.x) * words_per_chunk;
  const uint64_t words = min(words_per_chunk, piece_bytes / kWordBytes - first);
  const uint4* c = piece + first;
  unsigned long long acc = 0;
  for (uint64_t i = threadIdx.x; i < words; i += blockDim.x) {
    const uint4 v = c[i];
    const uint4 k = key[i];
    acc += static_cast<unsigned long long>(v.x + k.x) * (v.y + k.y) +
           static_cast<unsigned long long>(v.z + k.z) * (v.w + k.w);
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

// SHA-256 (FIPS 180-4) of one thread's message.
__constant__ uint32_t kSha256K[64] = {
    0x428a2f98u, 0x71374491u, 0xb5c0fbcfu, 0xe9b5dba5u, 0x3956c25bu, 0x59f111f1u, 0x923f82a4u,
    0xab1c5ed5u, 0xd807aa98u, 0x12835b01u, 0x243185beu, 0x550c7dc3u, 0x72be5d74u, 0x80deb1feu,
    0x9bdc06a7u, 0xc19bf174u, 0xe49b69c1u, 0xefbe4786u, 0x0fc19dc6u, 0x240ca1ccu, 0x2de92c6fu,
    0x4a7484aau, 0x5cb0a9dcu, 0x76f988dau, 0x983e5152u, 0xa831c66du, 0xb00327c8u, 0xbf597fc7u,
    0xc6e00bf3u, 0xd5a79147u, 0x06ca6351u, 0x14292967u, 0x27b70a85u, 0x2e1b2138u, 0x4d2c6dfcu,
    0x53380d13u, 0x650a7354u, 0x766a0abbu, 0x81c2c92eu, 0x92722c85u, 0xa2bfe8a1u, 0xa81a664bu,
    0xc24b8b70u, 0xc76c51a3u, 0xd192e819u, 0xd6990624u, 0xf40e3585u, 0x106aa070u, 0x19a4c116u,
    0x1e376c08u, 0x2748774cu, 0x34b0bcb5u, 0x391c0cb3u, 0x4ed8aa4au, 0x5b9cca4fu, 0x682e6ff3u,
    0x748f82eeu, 0x78a5636fu, 0x84c87814u, 0x8cc70208u, 0x90befffau, 0xa4506cebu, 0xbef9a3f7u,
    0xc67178f2u};

__device__ __forceinline__ uint32_t Rotr(uint32_t x, int n) { return __funnelshift_r(x, x, n); }
__device__ __forceinline__ uint32_t Be(uint32_t x) { return __byte_perm(x, 0, 0x0123); }

struct Sha256State {
  uint32_t h[8];
  __device__ void Init() {
    h[0] = 0x6a09e667u;
    h[1] = 0xbb67ae85u;
    h[2] = 0x3c6ef372u;
    h[3] = 0xa54ff53au;
    h[4] = 0x510e527fu;
    h[5] = 0x9b05688cu;
    h[6] = 0x1f83d9abu;
    h[7] = 0x5be0cd19u;
  }
  // One 64-byte block, as 16 big-endian words.
  __device__ void Compress(uint32_t w[16]) {
    uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], k = h[7];
#pragma unroll
    for (int i = 0; i < 64; ++i) {
      if (i >= 16) {
        const uint32_t w15 = w[(i - 15) & 15], w2 = w[(i - 2) & 15];
        const uint32_t s0 = Rotr(w15, 7) ^ Rotr(w15, 18) ^ (w15 >> 3);
        const uint32_t s1 = Rotr(w2, 17) ^ Rotr(w2, 19) ^ (w2 >> 10);
        w[i & 15] += s0 + w[(i - 7) & 15] + s1;
      }
      const uint32_t t1 = k + (Rotr(e, 6) ^ Rotr(e, 11) ^ Rotr(e, 25)) + ((e & f) ^ (~e & g)) +
                          kSha256K[i] + w[i & 15];
      const uint32_t t2 = (Rotr(a, 2) ^ Rotr(a, 13) ^ Rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
      k = g;
      g = f;
      f = e;
      e = d + t1;
      d = c;
      c = b;
      b = a;
      a = t1 + t2;
    }
    h[0] += a;
    h[1] += b;
    h[2] += c;
    h[3] += d;
    h[4] += e;
    h[5] += f;
    h[6] += g;
    h[7] += k;
  }
  // The last block: `words` (< 14, so one block) big-endian words of data already in w,
  // then the padding and the message's length in bytes.
  __device__ void Finish(uint32_t w[16], int words, uint64_t message_bytes) {
    w[words] = 0x80000000u;
    for (int i = words + 1; i < 14; ++i) w[i] = 0;
    w[14] = static_cast<uint32_t>((message_bytes * 8) >> 32);
    w[15] = static_cast<uint32_t>(message_bytes * 8);
    Compress(w);
  }
};

// Chunk blockIdx.x of a piece (`piece_bytes` long, starting at a chunk boundary): thread t
// hashes leaf t, thread 0 then hashes the leaf values; the chunk value goes to out[32 * c].
__global__ void __launch_bounds__(kLeavesPerChunk)
    ChunkHashKernel(const uint4* __restrict__ piece, uint64_t piece_bytes,
                    unsigned char* __restrict__ out) {
  __shared__ uint32_t leaves[kLeavesPerChunk * 8];
  const uint64_t chunk_begin = static_cast<uint64_t>(blockIdx.x) * kChunkBytes;
  const uint64_t chunk_bytes = min(kChunkBytes, piece_bytes - chunk_begin);
  const uint64_t leaf_begin = chunk_begin + threadIdx.x * kLeafBytes;
  if (leaf_begin < chunk_begin + chunk_bytes) {
    const uint64_t n = min(kLeafBytes, chunk_begin + chunk_bytes - leaf_begin);  // % 16 == 0
    const uint4* p = piece + leaf_begin / sizeof(uint4);
    Sha256State st;
    st.Init();
    uint32_t w[16];
    const uint64_t blocks = n / 64;
    for (uint64_t b = 0; b < blocks; ++b) {
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const uint4 v = p[b * 4 + q];
        w[4 * q] = Be(v.x);
        w[4 * q + 1] = Be(v.y);
        w[4 * q + 2] = Be(v.z);
        w[4 * q + 3] = Be(v.w);
      }
      st.Compress(w);
    }
    const int rest = static_cast<int>((n % 64) / 16);  // 16-byte words after the last block
    for (int q = 0; q < rest; ++q) {
      const uint4 v = p[blocks * 4 + q];
      w[4 * q] = Be(v.x);
      w[4 * q + 1] = Be(v.y);
      w[4 * q + 2] = Be(v.z);
      w[4 * q + 3] = Be(v.w);
    }
    st.Finish(w, rest * 4, n);
#pragma unroll
    for (int i = 0; i < 8; ++i) leaves[threadIdx.x * 8 + i] = st.h[i];
  }
  __syncthreads();
  if (threadIdx.x != 0) return;
  const int count = static_cast<int>((chunk_bytes + kLeafBytes - 1) / kLeafBytes);
  const int words = count * 8;
  Sha256State st;
  st.Init();
  uint32_t w[16];
  int i = 0;
  for (; i + 16 <= words; i += 16) {
    for (int j = 0; j < 16; ++j) w[j] = leaves[i + j];
    st.Compress(w);
  }
  const int rest = words - i;  // 0 or 8
  for (int j = 0; j < rest; ++j) w[j] = leaves[i + j];
  st.Finish(w, rest, static_cast<uint64_t>(words) * 4);
  unsigned char* o = out + static_cast<uint64_t>(blockIdx.x) * kSha256Bytes;
  for (int j = 0; j < 8; ++j) {
    o[4 * j] = static_cast<unsigned char>(st.h[j] >> 24);
    o[4 * j + 1] = static_cast<unsigned char>(st.h[j] >> 16);
    o[4 * j + 2] = static_cast<unsigned char>(st.h[j] >> 8);
    o[4 * j + 3] = static_cast<unsigned char>(st.h[j]);
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
  unsigned char* sha_out = nullptr;
  size_t sha_capacity = 0;  // chunks `sha_out` holds
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
  // `key` on the current device (`ordinal`), copied at its first use there.
  absl::StatusOr<const uint4*> KeyOn(int ordinal, const ScrubKey& key, const std::string& where) {
    std::lock_guard<std::mutex> l(mu_);
    auto& on = keys_[{ordinal, &key}];
    if (on != nullptr) return on;
    const size_t bytes = key.words.size() * sizeof(uint32_t);
    if (key.words.size() != kKeyWords) {
      return absl::InternalError(absl::StrCat("digest of ", where, ": a key of ", key.words.size(),
                                              " words, not ", kKeyWords));
    }
    void* p = nullptr;
    if (auto st = Cuda(cudaMalloc(&p, bytes), "cudaMalloc (key)", where); !st.ok()) return st;
    if (auto st = Cuda(cudaMemcpy(p, key.words.data(), bytes, cudaMemcpyHostToDevice),
                       "cudaMemcpy (key)", where);
        !st.ok()) {
      cudaFree(p);
      return st;
    }
    on = static_cast<const uint4*>(p);
    return on;
  }

 private:
  std::mutex mu_;
  std::map<int, std::vector<Resources*>> idle_;
  std::map<std::pair<int, const ScrubKey*>, const uint4*> keys_;
};

// `*buf` holds at least `n` elements of T (grown after the stream's work is done).
template <typename T>
absl::Status Reserve(cudaStream_t stream, T** buf, size_t* capacity, size_t n,
                     const std::string& where) {
  if (*capacity >= n) return absl::OkStatus();
  if (*buf != nullptr) {
    cudaStreamSynchronize(stream);
    cudaFree(*buf);
    *buf = nullptr;
    *capacity = 0;
  }
  if (auto st = Cuda(cudaMalloc(buf, n * sizeof(T)), "cudaMalloc", where); !st.ok()) return st;
  *capacity = n;
  return absl::OkStatus();
}

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
                                           const Pacer& pacer, const ScrubKey& key, bool crypto) {
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
  auto device_key = ResourcePool::Get().KeyOn(*ordinal, key, where);
  if (!device_key.ok()) return device_key.status();
  Lent r(*ordinal);
  if (r->stream == nullptr) {
    if (auto st = Cuda(cudaStreamCreateWithPriority(&r->stream, cudaStreamNonBlocking, least),
                       "cudaStreamCreateWithPriority", where);
        !st.ok()) {
      return st;
    }
  }
  const size_t chunks = ChunkCount(size);
  if (auto st = Reserve(r->stream, &r->out, &r->capacity, chunks, where); !st.ok()) return st;
  if (crypto) {
    if (auto st = Reserve(r->stream, &r->sha_out, &r->sha_capacity, chunks * kSha256Bytes, where);
        !st.ok()) {
      return st;
    }
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
    const auto* p = reinterpret_cast<const uint4*>(device_ptr + piece);
    DigestKernel<<<blocks, kThreads, 0, r->stream>>>(p, n, *device_key,
                                                     r->out + piece / kChunkBytes);
    if (crypto) {
      ChunkHashKernel<<<blocks, kLeavesPerChunk, 0, r->stream>>>(
          p, n, r->sha_out + piece / kChunkBytes * kSha256Bytes);
    }
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
  std::string chunk_hashes(crypto ? chunks * kSha256Bytes : 0, '\0');
  // On the scrub stream itself: a non-blocking stream does not order with the legacy one.
  if (auto st = Cuda(cudaMemcpyAsync(d.chunks.data(), r->out, chunks * sizeof(uint64_t),
                                     cudaMemcpyDeviceToHost, r->stream),
                     "cudaMemcpyAsync", where);
      !st.ok()) {
    return st;
  }
  if (crypto) {
    if (auto st = Cuda(cudaMemcpyAsync(chunk_hashes.data(), r->sha_out, chunk_hashes.size(),
                                       cudaMemcpyDeviceToHost, r->stream),
                       "cudaMemcpyAsync", where);
        !st.ok()) {
      return st;
    }
  }
  if (auto st = Cuda(cudaStreamSynchronize(r->stream), "cudaStreamSynchronize", where); !st.ok()) {
    return st;
  }
  if (crypto) d.sha256 = TreeRoot(size, chunk_hashes);
  return d;
}

}  // namespace weightcache::integrity::internal
