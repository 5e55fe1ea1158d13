// The per-element device code of online block-FP8 quantization, shared by the kernels
// (fp8_quant.cu) and the exhaustive proofs that they equal the CPU maths
// (fp8_quant_testing.cu, tests only): widening, the block's amax, the fast 4-element paths.
// Private to pkg/load; included by .cu files only.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "pkg/load/internal/fp8_kernel.h"
#include "pkg/load/internal/fp8_math.h"

namespace weightcache::load::internal::kernel {

inline constexpr int kThreads = 256;

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

// Exact f16 -> f32 widening in hardware (equal to Fp8HalfToFloat for every non-NaN f16:
// Fp8Gpu.HardwareCvtEqualsSharedFunctionOverAllFloats; NaN takes the plain path).
template <bool kBf16>
__device__ __forceinline__ float WidenFast(uint16_t h) {
  if constexpr (kBf16) {
    return __uint_as_float(static_cast<uint32_t>(h) << 16);
  } else {
    return __half2float(__ushort_as_half(h));
  }
}

// Two e4m3fn codes, RN, saturating finite: lo in bits 0-7, hi in 8-15.
__device__ __forceinline__ uint32_t CvtE4M3x2(float lo, float hi) {
  uint16_t r;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
  return r;
}

// Four codes from two words of two 16-bit elements each, on the fast domain (finite
// elements, Fp8FastScaleOk(scale), y = Fp8Reciprocal(scale)).
template <bool kBf16, Fp8Variant kVariant>
__device__ __forceinline__ uint32_t QuantizeFast4(uint32_t w0, uint32_t w1, float scale, float y) {
  const float x[4] = {WidenFast<kBf16>(static_cast<uint16_t>(w0)),
                      WidenFast<kBf16>(static_cast<uint16_t>(w0 >> 16)),
                      WidenFast<kBf16>(static_cast<uint16_t>(w1)),
                      WidenFast<kBf16>(static_cast<uint16_t>(w1 >> 16))};
  float q[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) q[i] = Fp8DivByReciprocal(x[i], scale, y);
  if constexpr (kVariant == Fp8Variant::kFastCvt) {
    return CvtE4M3x2(q[0], q[1]) | (CvtE4M3x2(q[2], q[3]) << 16);
  } else {
    uint32_t r = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) r |= static_cast<uint32_t>(Fp8FloatToE4M3(q[i])) << (8 * i);
    return r;
  }
}

// The plain path for four elements: Fp8QuantizeElement.
template <bool kBf16>
__device__ __forceinline__ uint32_t QuantizeRef4(uint32_t w0, uint32_t w1, float scale) {
  const uint16_t h[4] = {static_cast<uint16_t>(w0), static_cast<uint16_t>(w0 >> 16),
                         static_cast<uint16_t>(w1), static_cast<uint16_t>(w1 >> 16)};
  uint32_t r = 0;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    r |= static_cast<uint32_t>(Fp8QuantizeElement(Widen<kBf16>(h[i]), scale)) << (8 * i);
  }
  return r;
}

}  // namespace weightcache::load::internal::kernel
