// The GPU quantizer's test and benchmark side (library load_testing, never linked by the
// daemon): host-in/host-out quantization on one device, timing on seeded random data, and the
// exhaustive proofs that the kernels' fast paths equal the CPU maths (fp8_kernel_testing.h).
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

#include "pkg/load/internal/fp8_device.cuh"
#include "pkg/load/internal/fp8_kernel.h"
#include "pkg/load/internal/fp8_kernel_testing.h"
#include "pkg/load/internal/fp8_math.h"

namespace weightcache::load::internal::kernel {
namespace {

// SplitMix64-seeded random bf16/f16 bits with a spread of exponents (benchmark input).
__global__ void FillRandom(uint16_t* p, int64_t n, uint64_t seed, bool bf16) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    uint64_t x = seed + static_cast<uint64_t>(i) * 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    x ^= x >> 31;
    // No inf or NaN. bf16: exponents 2^-8 .. 2^7 (weights' range; until 2026-11-29 this was
    // the f16 formula for both, which gave bf16 exponents 2^-72 .. 2^-57: block scales below
    // 2^-64, the fast kernel's plain path). f16: 2^-9 .. 2^-7.
    const uint64_t k = (x >> 8) & 0xF;
    p[i] = static_cast<uint16_t>(bf16 ? (x & 0x807F) | ((0x77 + k) << 7)
                                      : (x & 0x807F) | ((0x37 + k) << 7));
  }
}

}  // namespace

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

int QuantizeOnDevice(Fp8Variant variant, int ordinal, bool bf16, const void* src, int64_t rows,
                     int64_t cols, int block_rows, int block_cols, uint8_t* out_fp8,
                     float* out_scale_inv) {
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
    const int l = LaunchFp8BlockQuantVariant(variant, bf16, d_src, rows, cols, block_rows,
                                             block_cols, static_cast<uint8_t*>(d_out),
                                             static_cast<float*>(d_scale), nullptr);
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

int TimeOnDevice(Fp8Variant variant, int ordinal, bool bf16, int64_t rows, int64_t cols, int iters,
                 double* seconds) {
  constexpr uint64_t kFlushBytes = 256ull << 20;  // > the H200's 50 MiB L2
  WC_CUDA_TRY(cudaSetDevice(ordinal));
  const uint64_t n = static_cast<uint64_t>(rows) * static_cast<uint64_t>(cols);
  const uint64_t ns = static_cast<uint64_t>((rows + 127) / 128) * ((cols + 127) / 128);
  void *d_src = nullptr, *d_out = nullptr, *d_scale = nullptr, *d_flush = nullptr;
  cudaEvent_t e0 = nullptr, e1 = nullptr;
  auto run = [&]() -> cudaError_t {
    cudaError_t e;
    if ((e = cudaMalloc(&d_src, n * 2)) != cudaSuccess) return e;
    if ((e = cudaMalloc(&d_out, n)) != cudaSuccess) return e;
    if ((e = cudaMalloc(&d_scale, ns * 4)) != cudaSuccess) return e;
    if ((e = cudaMalloc(&d_flush, kFlushBytes)) != cudaSuccess) return e;
    FillRandom<<<1024, 256>>>(static_cast<uint16_t*>(d_src), static_cast<int64_t>(n), 42, bf16);
    if ((e = cudaEventCreate(&e0)) != cudaSuccess) return e;
    if ((e = cudaEventCreate(&e1)) != cudaSuccess) return e;
    std::vector<float> ms;
    for (int i = 0; i <= iters; ++i) {
      // Evicts the source from L2 (an unflushed repeat of a shape below 50 MiB would be
      // served from L2), and keeps the GPU busy while e0 and the launch are queued.
      cudaMemsetAsync(d_flush, i & 0xFF, kFlushBytes);
      cudaEventRecord(e0);
      const int l = LaunchFp8BlockQuantVariant(variant, bf16, d_src, rows, cols, 128, 128,
                                               static_cast<uint8_t*>(d_out),
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
  cudaFree(d_flush);
  return rc;
}

namespace {

__global__ void CvtProof(unsigned long long* counts) {
  unsigned long long finite = 0, nan = 0, widen = 0;
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t i = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x; i < (1ull << 32);
       i += stride) {
    const uint32_t u = static_cast<uint32_t>(i);
    const float f = __uint_as_float(u);
    const uint32_t hw = CvtE4M3x2(f, 0.0f) & 0xFFu;
    if (hw != Fp8FloatToE4M3(f)) {
      if ((u & kFp8AbsMask) > kFp8InfBits) {
        ++nan;
      } else {
        ++finite;
      }
    }
    if (i < 0x10000u && (u & 0x7FFFu) <= 0x7C00u &&
        __float_as_uint(WidenFast<false>(static_cast<uint16_t>(u))) !=
            __float_as_uint(Fp8HalfToFloat(static_cast<uint16_t>(u)))) {
      ++widen;
    }
  }
  if (finite) atomicAdd(&counts[0], finite);
  if (nan) atomicAdd(&counts[1], nan);
  if (widen) atomicAdd(&counts[2], widen);
}

// blockIdx.x: amax's 16-bit pattern (0 .. 0x7FFF); each thread takes x in groups of four.
template <bool kBf16, Fp8Variant kVariant>
__global__ void FastElementProof(unsigned long long* counts) {
  const uint16_t amax16 = static_cast<uint16_t>(blockIdx.x);
  const uint32_t special_from = kBf16 ? 0x7F80u : 0x7C00u;
  if (amax16 >= special_from) return;
  const float amax = Widen<kBf16>(amax16);
  const float scale = Fp8ScaleFromAmax(amax);
  const float y = Fp8Reciprocal(scale);
  const bool scale_ok = Fp8FastScaleOk(scale);
  unsigned long long in_domain = 0, outside = 0, pairs = 0;
  for (uint32_t x0 = threadIdx.x * 4; x0 < 0x10000u; x0 += blockDim.x * 4) {
    const uint32_t w0 = x0 | ((x0 + 1) << 16), w1 = (x0 + 2) | ((x0 + 3) << 16);
    const uint32_t fast = QuantizeFast4<kBf16, kVariant>(w0, w1, scale, y);
#pragma unroll
    for (uint32_t i = 0; i < 4; ++i) {
      const uint16_t h = static_cast<uint16_t>(x0 + i);
      const uint32_t mag = h & 0x7FFFu;
      if (mag >= special_from) continue;  // NaN, Inf: never on the fast path
      const bool domain = scale_ok && mag <= amax16;
      const bool equal = ((fast >> (8 * i)) & 0xFFu) == Fp8QuantizeElement(Widen<kBf16>(h), scale);
      pairs += domain;
      if (!equal) {
        if (domain) {
          ++in_domain;
        } else {
          ++outside;
        }
      }
    }
  }
  if (in_domain) atomicAdd(&counts[0], in_domain);
  if (outside) atomicAdd(&counts[1], outside);
  if (pairs) atomicAdd(&counts[2], pairs);
}

int RunProof(int ordinal, void (*launch)(unsigned long long*), uint64_t* out) {
  WC_CUDA_TRY(cudaSetDevice(ordinal));
  unsigned long long* d = nullptr;
  WC_CUDA_TRY(cudaMalloc(&d, 3 * sizeof *d));
  cudaError_t e = cudaMemset(d, 0, 3 * sizeof *d);
  if (e == cudaSuccess) {
    launch(d);
    e = cudaGetLastError();
  }
  if (e == cudaSuccess) e = cudaDeviceSynchronize();
  unsigned long long h[3] = {0, 0, 0};
  if (e == cudaSuccess) e = cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost);
  cudaFree(d);
  for (int i = 0; i < 3; ++i) out[i] = h[i];
  return static_cast<int>(e);
}

void LaunchCvtProof(unsigned long long* d) { CvtProof<<<132 * 16, 256>>>(d); }

template <bool kBf16, Fp8Variant kVariant>
void LaunchFastElementProof(unsigned long long* d) {
  FastElementProof<kBf16, kVariant><<<0x8000, 256>>>(d);
}

}  // namespace

int CountCvtMismatches(int ordinal, uint64_t* finite_or_inf, uint64_t* nan, uint64_t* half_widen) {
  uint64_t c[3];
  const int rc = RunProof(ordinal, LaunchCvtProof, c);
  *finite_or_inf = c[0];
  *nan = c[1];
  *half_widen = c[2];
  return rc;
}

int CountFastElementMismatches(int ordinal, Fp8Variant variant, bool bf16, uint64_t* in_domain,
                               uint64_t* outside, uint64_t* pairs) {
  void (*launch)(unsigned long long*) = nullptr;
  if (variant == Fp8Variant::kFastCvt) {
    launch = bf16 ? LaunchFastElementProof<true, Fp8Variant::kFastCvt>
                  : LaunchFastElementProof<false, Fp8Variant::kFastCvt>;
  } else {
    launch = bf16 ? LaunchFastElementProof<true, Fp8Variant::kFastInt>
                  : LaunchFastElementProof<false, Fp8Variant::kFastInt>;
  }
  uint64_t c[3];
  const int rc = RunProof(ordinal, launch, c);
  *in_domain = c[0];
  *outside = c[1];
  *pairs = c[2];
  return rc;
}

}  // namespace weightcache::load::internal::kernel
