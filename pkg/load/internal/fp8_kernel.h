// The CUDA side of online block-FP8 quantization, as plain functions returning cudaError_t
// values (0 = success), so that fp8_quant.cu needs neither abseil nor any weightcache header
// but internal/fp8_math.h; fp8_quant_gpu.cc wraps them into internal/fp8_quant_cuda.h.
// Private to pkg/load. Thread-safety: as the CUDA runtime (current context per thread).
#pragma once

#include <cstdint>

namespace weightcache::load::internal::kernel {

// The fast (128x128) kernel's per-element paths, fp8_quant.cu's header says which is which.
// Production uses kProductionVariant; tests and the benchmark run all of them.
enum class Fp8Variant : int { kReference = 0, kFastInt = 1, kFastCvt = 2 };
inline constexpr Fp8Variant kProductionVariant = Fp8Variant::kFastCvt;

// Launches with kProductionVariant.
int LaunchFp8BlockQuant(bool bf16, const void* src, int64_t rows, int64_t cols, int block_rows,
                        int block_cols, uint8_t* out_fp8, float* out_scale_inv, void* stream);
int LaunchFp8BlockQuantVariant(Fp8Variant variant, bool bf16, const void* src, int64_t rows,
                               int64_t cols, int block_rows, int block_cols, uint8_t* out_fp8,
                               float* out_scale_inv, void* stream);
int CopyToDeviceAsync(void* dst, const void* src, uint64_t n, void* stream);
int DeviceAlloc(void** p, uint64_t bytes);
int DeviceFree(void* p);
const char* ErrorName(int error);

// Tests and benchmarks.
int DeviceCount(int* count);
// Selects device `ordinal`, copies src in, quantizes, copies the results out, synchronizes.
int QuantizeOnDevice(Fp8Variant variant, int ordinal, bool bf16, const void* src, int64_t rows,
                     int64_t cols, int block_rows, int block_cols, uint8_t* out_fp8,
                     float* out_scale_inv);
// Median seconds of `iters` launches on seeded random device data (after one warm-up), the
// L2 cache flushed (a 256 MiB memset) before each timed launch.
int TimeOnDevice(Fp8Variant variant, int ordinal, bool bf16, int64_t rows, int64_t cols, int iters,
                 double* seconds);

// Exhaustive equivalence proofs, run on device `ordinal` (counts of mismatches):
// cvt.rn.satfinite.e4m3x2.f32 against Fp8FloatToE4M3 over all 2^32 float bit patterns
// (`finite_or_inf` over non-NaN inputs, `nan` over NaN ones), and the hardware f16 -> f32
// widening against Fp8HalfToFloat over all non-NaN f16 (`half_widen`).
int CountCvtMismatches(int ordinal, uint64_t* finite_or_inf, uint64_t* nan, uint64_t* half_widen);
// The fast element path of `variant` (the kernel's own QuantizeFast4) against
// Fp8QuantizeElement for every finite amax and every 16-bit x: `in_domain` counts mismatches
// where the kernel takes that path (x finite, |x| <= amax, Fp8FastScaleOk), `outside` the
// others (for information); `pairs` counts in-domain pairs.
int CountFastElementMismatches(int ordinal, Fp8Variant variant, bool bf16, uint64_t* in_domain,
                               uint64_t* outside, uint64_t* pairs);

}  // namespace weightcache::load::internal::kernel
