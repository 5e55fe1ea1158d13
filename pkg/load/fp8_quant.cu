// Online block-FP8 quantization on the GPU: one thread block per weight block. The
// per-element maths is internal/fp8_math.h, the very code the CPU quantizer (fp8_quant.cc)
// runs, so the two agree bit for bit; amax is a max (order-independent) and the two float
// operations are single IEEE divisions (__fdiv_rn), so no reduction order or fast-math
// setting can change a result.
//
// Fast path (128x128 blocks, cols % 8 == 0, 16-byte aligned source, 8-byte aligned output):
// 256 threads, each loads 8 consecutive elements (16 bytes) of 8 rows into registers, the
// block's amax is reduced in registers / warp / shared memory, then each thread quantizes
// its 64 elements from registers and stores 8 codes at a time: one read of the source and
// one write of the codes. Any other shape: the generic kernel (a strided loop over the
// block, reading it twice; the second read hits L2).
#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

#include "pkg/load/internal/fp8_kernel.h"
#include "pkg/load/internal/fp8_math.h"

namespace weightcache::load::internal::kernel {
namespace {

constexpr int kThreads = 256;

template <bool kBf16>
__device__ __forceinline__ float Widen(uint16_t h) {
  if constexpr (kBf16) {
    return Fp8Bf16ToFloat(h);
  } else {
    return Fp8HalfToFloat(h);
  }
}

// The block's amax: every thread passes its partial; all threads get the result.
__device__ __forceinline__ float BlockMax(float v, unsigned* smem) {
  unsigned u = __float_as_uint(v);  // non-negative, non-NaN: bits order like values
  u = __reduce_max_sync(0xFFFFFFFFu, u);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (lane == 0) smem[warp] = u;
  __syncthreads();
  u = lane < (kThreads >> 5) ? smem[lane] : 0u;
  u = __reduce_max_sync(0xFFFFFFFFu, u);
  return __uint_as_float(u);
}

template <bool kBf16>
__global__ void __launch_bounds__(kThreads)
    Quant128(const uint16_t* __restrict__ src, int64_t rows, int64_t cols, int64_t bcols,
             uint8_t* __restrict__ out, float* __restrict__ scale_out) {
  __shared__ unsigned smem[kThreads / 32];
  const int64_t b = blockIdx.x;
  const int64_t bi = b / bcols, bj = b % bcols;
  const int cv = threadIdx.x & 15;  // which 8 columns of the block
  const int r0 = threadIdx.x >> 4;  // first of this thread's rows (r0 + 16 k)
  const int64_t c = bj * 128 + cv * 8;
  const bool col_ok = c < cols;  // cols % 8 == 0: 8 columns are all in or all out
  uint4 v[8];
  float amax = 0.0f;
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    const int64_t r = bi * 128 + r0 + 16 * k;
    if (col_ok && r < rows) {
      v[k] = __ldg(reinterpret_cast<const uint4*>(src + r * cols + c));
      const uint32_t w[4] = {v[k].x, v[k].y, v[k].z, v[k].w};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        amax = Fp8MaxAbs(amax, Fp8FiniteAbs(Widen<kBf16>(static_cast<uint16_t>(w[j]))));
        amax = Fp8MaxAbs(amax, Fp8FiniteAbs(Widen<kBf16>(static_cast<uint16_t>(w[j] >> 16))));
      }
    } else {
      v[k] = make_uint4(0, 0, 0, 0);
    }
  }
  amax = BlockMax(amax, smem);
  const float scale = Fp8ScaleFromAmax(amax);
  if (threadIdx.x == 0) scale_out[b] = scale;
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    const int64_t r = bi * 128 + r0 + 16 * k;
    if (!col_ok || r >= rows) continue;
    const uint32_t w[4] = {v[k].x, v[k].y, v[k].z, v[k].w};
    uint32_t packed[2] = {0, 0};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint32_t lo = Fp8QuantizeElement(Widen<kBf16>(static_cast<uint16_t>(w[j])), scale);
      const uint32_t hi =
          Fp8QuantizeElement(Widen<kBf16>(static_cast<uint16_t>(w[j] >> 16)), scale);
      packed[j >> 1] |= (lo | (hi << 8)) << (16 * (j & 1));
    }
    *reinterpret_cast<uint2*>(out + r * cols + c) = make_uint2(packed[0], packed[1]);
  }
}

template <bool kBf16>
__global__ void __launch_bounds__(kThreads)
    QuantGeneric(const uint16_t* __restrict__ src, int64_t rows, int64_t cols, int br, int bc,
                 int64_t bcols, uint8_t* __restrict__ out, float* __restrict__ scale_out) {
  __shared__ unsigned smem[kThreads / 32];
  const int64_t b = blockIdx.x;
  const int64_t bi = b / bcols, bj = b % bcols;
  const int64_t r0 = bi * br, c0 = bj * bc;
  const int64_t h = min(static_cast<int64_t>(br), rows - r0);
  const int64_t w = min(static_cast<int64_t>(bc), cols - c0);
  float amax = 0.0f;
  for (int64_t i = threadIdx.x; i < h * w; i += kThreads) {
    const int64_t r = r0 + i / w, c = c0 + i % w;
    amax = Fp8MaxAbs(amax, Fp8FiniteAbs(Widen<kBf16>(src[r * cols + c])));
  }
  amax = BlockMax(amax, smem);
  const float scale = Fp8ScaleFromAmax(amax);
  if (threadIdx.x == 0) scale_out[b] = scale;
  for (int64_t i = threadIdx.x; i < h * w; i += kThreads) {
    const int64_t r = r0 + i / w, c = c0 + i % w;
    out[r * cols + c] = Fp8QuantizeElement(Widen<kBf16>(src[r * cols + c]), scale);
  }
}

// SplitMix64-seeded random bf16/f16 bits with a spread of exponents (benchmark input).
__global__ void FillRandom(uint16_t* p, int64_t n, uint64_t seed) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    uint64_t x = seed + static_cast<uint64_t>(i) * 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    x ^= x >> 31;
    // Exponents 2^-8 .. 2^7 (bf16) / similar for f16: no inf or NaN.
    p[i] = static_cast<uint16_t>((x & 0x807F) | ((0x37 + ((x >> 8) & 0xF)) << 7));
  }
}

}  // namespace

int LaunchFp8BlockQuant(bool bf16, const void* src, int64_t rows, int64_t cols, int block_rows,
                        int block_cols, uint8_t* out_fp8, float* out_scale_inv, void* stream) {
  if (rows <= 0 || cols <= 0) return 0;
  const int64_t brows = (rows + block_rows - 1) / block_rows;
  const int64_t bcols = (cols + block_cols - 1) / block_cols;
  const int64_t blocks = brows * bcols;
  if (blocks > 0x7FFFFFFF) return static_cast<int>(cudaErrorInvalidConfiguration);
  auto s = static_cast<cudaStream_t>(stream);
  const auto* in = static_cast<const uint16_t*>(src);
  const bool fast = block_rows == 128 && block_cols == 128 && cols % 8 == 0 &&
                    reinterpret_cast<uintptr_t>(src) % 16 == 0 &&
                    reinterpret_cast<uintptr_t>(out_fp8) % 8 == 0;
  const dim3 grid(static_cast<unsigned>(blocks));
  if (fast && bf16) {
    Quant128<true><<<grid, kThreads, 0, s>>>(in, rows, cols, bcols, out_fp8, out_scale_inv);
  } else if (fast) {
    Quant128<false><<<grid, kThreads, 0, s>>>(in, rows, cols, bcols, out_fp8, out_scale_inv);
  } else if (bf16) {
    QuantGeneric<true><<<grid, kThreads, 0, s>>>(in, rows, cols, block_rows, block_cols, bcols,
                                                 out_fp8, out_scale_inv);
  } else {
    QuantGeneric<false><<<grid, kThreads, 0, s>>>(in, rows, cols, block_rows, block_cols, bcols,
                                                  out_fp8, out_scale_inv);
  }
  return static_cast<int>(cudaGetLastError());
}

int CopyToDeviceAsync(void* dst, const void* src, uint64_t n, void* stream) {
  return static_cast<int>(
      cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, static_cast<cudaStream_t>(stream)));
}

int DeviceAlloc(void** p, uint64_t bytes) { return static_cast<int>(cudaMalloc(p, bytes)); }

int DeviceFree(void* p) { return static_cast<int>(cudaFree(p)); }

const char* ErrorName(int error) { return cudaGetErrorName(static_cast<cudaError_t>(error)); }

int DeviceCount(int* count) {
  *count = 0;
  const cudaError_t e = cudaGetDeviceCount(count);
  if (e != cudaSuccess) *count = 0;
  return static_cast<int>(e);
}

#define WC_CUDA_TRY(x)                                  \
  do {                                                  \
    const cudaError_t e_ = (x);                         \
    if (e_ != cudaSuccess) return static_cast<int>(e_); \
  } while (0)

int QuantizeOnDevice(int ordinal, bool bf16, const void* src, int64_t rows, int64_t cols,
                     int block_rows, int block_cols, uint8_t* out_fp8, float* out_scale_inv) {
  WC_CUDA_TRY(cudaSetDevice(ordinal));
  const uint64_t n = static_cast<uint64_t>(rows) * static_cast<uint64_t>(cols);
  const uint64_t ns = static_cast<uint64_t>((rows + block_rows - 1) / block_rows) *
                      static_cast<uint64_t>((cols + block_cols - 1) / block_cols);
  void *d_src = nullptr, *d_out = nullptr, *d_scale = nullptr;
  int rc = 0;
  auto run = [&]() -> cudaError_t {
    cudaError_t e;
    if ((e = cudaMalloc(&d_src, n * 2 + 16)) != cudaSuccess) return e;
    if ((e = cudaMalloc(&d_out, n + 16)) != cudaSuccess) return e;
    if ((e = cudaMalloc(&d_scale, ns * 4 + 16)) != cudaSuccess) return e;
    if ((e = cudaMemcpy(d_src, src, n * 2, cudaMemcpyHostToDevice)) != cudaSuccess) return e;
    const int l =
        LaunchFp8BlockQuant(bf16, d_src, rows, cols, block_rows, block_cols,
                            static_cast<uint8_t*>(d_out), static_cast<float*>(d_scale), nullptr);
    if (l != 0) return static_cast<cudaError_t>(l);
    if ((e = cudaDeviceSynchronize()) != cudaSuccess) return e;
    if ((e = cudaMemcpy(out_fp8, d_out, n, cudaMemcpyDeviceToHost)) != cudaSuccess) return e;
    return cudaMemcpy(out_scale_inv, d_scale, ns * 4, cudaMemcpyDeviceToHost);
  };
  rc = static_cast<int>(run());
  cudaFree(d_src);
  cudaFree(d_out);
  cudaFree(d_scale);
  return rc;
}

int TimeOnDevice(int ordinal, bool bf16, int64_t rows, int64_t cols, int iters, double* seconds) {
  WC_CUDA_TRY(cudaSetDevice(ordinal));
  const uint64_t n = static_cast<uint64_t>(rows) * static_cast<uint64_t>(cols);
  const uint64_t ns = static_cast<uint64_t>((rows + 127) / 128) * ((cols + 127) / 128);
  void *d_src = nullptr, *d_out = nullptr, *d_scale = nullptr;
  cudaEvent_t e0 = nullptr, e1 = nullptr;
  auto run = [&]() -> cudaError_t {
    cudaError_t e;
    if ((e = cudaMalloc(&d_src, n * 2)) != cudaSuccess) return e;
    if ((e = cudaMalloc(&d_out, n)) != cudaSuccess) return e;
    if ((e = cudaMalloc(&d_scale, ns * 4)) != cudaSuccess) return e;
    FillRandom<<<1024, 256>>>(static_cast<uint16_t*>(d_src), static_cast<int64_t>(n), 42);
    if ((e = cudaEventCreate(&e0)) != cudaSuccess) return e;
    if ((e = cudaEventCreate(&e1)) != cudaSuccess) return e;
    std::vector<float> ms;
    for (int i = 0; i <= iters; ++i) {
      cudaEventRecord(e0);
      const int l =
          LaunchFp8BlockQuant(bf16, d_src, rows, cols, 128, 128, static_cast<uint8_t*>(d_out),
                              static_cast<float*>(d_scale), nullptr);
      if (l != 0) return static_cast<cudaError_t>(l);
      cudaEventRecord(e1);
      if ((e = cudaEventSynchronize(e1)) != cudaSuccess) return e;
      float t = 0;
      cudaEventElapsedTime(&t, e0, e1);
      if (i > 0) ms.push_back(t);  // the first launch is the warm-up
    }
    std::sort(ms.begin(), ms.end());
    *seconds = ms.empty() ? 0.0 : ms[ms.size() / 2] / 1e3;
    return cudaSuccess;
  };
  const int rc = static_cast<int>(run());
  if (e0 != nullptr) cudaEventDestroy(e0);
  if (e1 != nullptr) cudaEventDestroy(e1);
  cudaFree(d_src);
  cudaFree(d_out);
  cudaFree(d_scale);
  return rc;
}

}  // namespace weightcache::load::internal::kernel
