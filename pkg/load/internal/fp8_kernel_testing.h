// Test and benchmark entry points of the GPU quantizer (fp8_quant_testing.cu, library
// load_testing: never in the daemon). Plain functions returning cudaError_t values.
// Private to pkg/load. Thread-safety: as the CUDA runtime.
#pragma once

#include <cstdint>

#include "pkg/load/internal/fp8_kernel.h"

namespace weightcache::load::internal::kernel {

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
