// Online block-FP8 quantization on the GPU: one thread block per weight block. The
// per-element maths is internal/fp8_math.h, the very code the CPU quantizer (fp8_quant.cc)
// runs, or a form of it proven equal by exhaustion; amax is a max (order-independent), so no
// reduction order can change a result.
//
// Fast path (128x128 blocks, cols % 8 == 0, 16-byte aligned source, 8-byte aligned output):
// 256 threads, each loads 8 consecutive elements (16 bytes) of 8 rows into registers, the
// block's amax is reduced in registers (16-bit integer max over |x|: the bit patterns of
// non-negative bf16/f16 values order like the values) / warp / shared memory, then each
// thread quantizes its 64 elements from registers and stores 8 codes at a time: one read of
// the source and one write of the codes. Three variants (Fp8Variant):
//   kReference  Fp8QuantizeElement per element (__fdiv_rn, integer FloatToE4M3): the kernel
//               as first written (0.8-1.0 TB/s on the H200, compute-bound);
//   kFastInt    the block's reciprocal and Fp8DivByReciprocal (proven equal, fp8_math.h),
//               then the integer Fp8FloatToE4M3;
//   kFastCvt    Fp8DivByReciprocal, then the hardware cvt.rn.satfinite.e4m3x2.f32, two codes
//               per instruction (proven equal to Fp8FloatToE4M3 over all 2^32 floats but NaN:
//               fp8_quant_gpu_test Fp8Gpu.HardwareCvtEqualsSharedFunctionOverAllFloats).
// The fast variants send a thread whose 64 elements hold a NaN or an Inf, and a block whose
// scale is below 2^-64, through Fp8QuantizeElement (rare; outside the proven domain).
// Any other shape: the generic kernel (a strided loop over the block, reading it twice; the
// second read hits L2).
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

#include "pkg/load/internal/fp8_device.cuh"
#include "pkg/load/internal/fp8_kernel.h"
#include "pkg/load/internal/fp8_math.h"

namespace weightcache::load::internal::kernel {
namespace {

template <bool kBf16, Fp8Variant kVariant>
__global__ void __launch_bounds__(kThreads)
    Quant128(const uint16_t* __restrict__ src, int64_t rows, int64_t cols, int64_t bcols,
             uint8_t* __restrict__ out, float* __restrict__ scale_out) {
  constexpr bool kFast = kVariant != Fp8Variant::kReference;
  // |x| of a 16-bit element is an Inf or NaN iff |x| + this carries into bit 15.
  constexpr uint32_t kSpecialAdd = kBf16 ? 0x00800080u : 0x04000400u;
  __shared__ unsigned smem[kThreads / 32];
  const int64_t b = blockIdx.x;
  const int64_t bi = b / bcols, bj = b % bcols;
  const int cv = threadIdx.x & 15;  // which 8 columns of the block
  const int r0 = threadIdx.x >> 4;  // first of this thread's rows (r0 + 16 k)
  const int64_t c = bj * 128 + cv * 8;
  const bool col_ok = c < cols;  // cols % 8 == 0: 8 columns are all in or all out
  uint4 v[8];
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    const int64_t r = bi * 128 + r0 + 16 * k;
    v[k] = (col_ok && r < rows) ? __ldg(reinterpret_cast<const uint4*>(src + r * cols + c))
                                : make_uint4(0, 0, 0, 0);
  }
  float amax = 0.0f;
  bool special = false;  // a NaN or Inf among this thread's elements
  if constexpr (kFast) {
    uint32_t mx = 0, sp = 0;
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const uint32_t w[4] = {v[k].x, v[k].y, v[k].z, v[k].w};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const uint32_t a = w[j] & 0x7FFF7FFFu;
        sp |= a + kSpecialAdd;
        mx = __vmaxu2(mx, a);
      }
    }
    special = (sp & 0x80008000u) != 0;
    const uint32_t m16 = max(mx & 0xFFFFu, mx >> 16);
    amax = Widen<kBf16>(static_cast<uint16_t>(m16));
  }
  if (!kFast || special) {
    amax = 0.0f;
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const uint32_t w[4] = {v[k].x, v[k].y, v[k].z, v[k].w};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        amax = Fp8MaxAbs(amax, Fp8FiniteAbs(Widen<kBf16>(static_cast<uint16_t>(w[j]))));
        amax = Fp8MaxAbs(amax, Fp8FiniteAbs(Widen<kBf16>(static_cast<uint16_t>(w[j] >> 16))));
      }
    }
  }
  amax = BlockMax(amax, smem);
  const float scale = Fp8ScaleFromAmax(amax);
  if (threadIdx.x == 0) scale_out[b] = scale;
  const bool fast = kFast && !special && Fp8FastScaleOk(scale);
  const float y = Fp8Reciprocal(scale);
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    const int64_t r = bi * 128 + r0 + 16 * k;
    if (!col_ok || r >= rows) continue;
    uint32_t lo, hi;
    if (fast) {
      lo = QuantizeFast4<kBf16, kVariant>(v[k].x, v[k].y, scale, y);
      hi = QuantizeFast4<kBf16, kVariant>(v[k].z, v[k].w, scale, y);
    } else {
      lo = QuantizeRef4<kBf16>(v[k].x, v[k].y, scale);
      hi = QuantizeRef4<kBf16>(v[k].z, v[k].w, scale);
    }
    *reinterpret_cast<uint2*>(out + r * cols + c) = make_uint2(lo, hi);
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

}  // namespace

namespace {

template <bool kBf16>
void LaunchQuant128(Fp8Variant variant, const uint16_t* in, int64_t rows, int64_t cols,
                    int64_t bcols, uint8_t* out, float* scale, dim3 grid, cudaStream_t s) {
  switch (variant) {
    case Fp8Variant::kReference:
      Quant128<kBf16, Fp8Variant::kReference>
          <<<grid, kThreads, 0, s>>>(in, rows, cols, bcols, out, scale);
      break;
    case Fp8Variant::kFastInt:
      Quant128<kBf16, Fp8Variant::kFastInt>
          <<<grid, kThreads, 0, s>>>(in, rows, cols, bcols, out, scale);
      break;
    case Fp8Variant::kFastCvt:
      Quant128<kBf16, Fp8Variant::kFastCvt>
          <<<grid, kThreads, 0, s>>>(in, rows, cols, bcols, out, scale);
      break;
  }
}

}  // namespace

int LaunchFp8BlockQuantVariant(Fp8Variant variant, bool bf16, const void* src, int64_t rows,
                               int64_t cols, int block_rows, int block_cols, uint8_t* out_fp8,
                               float* out_scale_inv, void* stream) {
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
    LaunchQuant128<true>(variant, in, rows, cols, bcols, out_fp8, out_scale_inv, grid, s);
  } else if (fast) {
    LaunchQuant128<false>(variant, in, rows, cols, bcols, out_fp8, out_scale_inv, grid, s);
  } else if (bf16) {
    QuantGeneric<true><<<grid, kThreads, 0, s>>>(in, rows, cols, block_rows, block_cols, bcols,
                                                 out_fp8, out_scale_inv);
  } else {
    QuantGeneric<false><<<grid, kThreads, 0, s>>>(in, rows, cols, block_rows, block_cols, bcols,
                                                  out_fp8, out_scale_inv);
  }
  return static_cast<int>(cudaGetLastError());
}

int LaunchFp8BlockQuant(bool bf16, const void* src, int64_t rows, int64_t cols, int block_rows,
                        int block_cols, uint8_t* out_fp8, float* out_scale_inv, void* stream) {
  return LaunchFp8BlockQuantVariant(kProductionVariant, bf16, src, rows, cols, block_rows,
                                    block_cols, out_fp8, out_scale_inv, stream);
}

int CopyToDeviceAsync(void* dst, const void* src, uint64_t n, void* stream) {
  return static_cast<int>(
      cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, static_cast<cudaStream_t>(stream)));
}

int DeviceAlloc(void** p, uint64_t bytes) { return static_cast<int>(cudaMalloc(p, bytes)); }

int DeviceFree(void* p) { return static_cast<int>(cudaFree(p)); }

const char* ErrorName(int error) { return cudaGetErrorName(static_cast<cudaError_t>(error)); }

}  // namespace weightcache::load::internal::kernel
