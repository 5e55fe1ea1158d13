// Test and benchmark side of the GPU quantizer (fp8_quant_gpu_testing.cc, library
// load_testing: never in the daemon): host-in/host-out quantization on one device, and its
// timing. Private to pkg/load, its GPU tests and benchmark. Thread-safety: any thread.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "pkg/load/internal/fp8_kernel.h"
#include "pkg/safetensors/safetensors.h"

namespace weightcache::load::internal {

using Fp8Variant = kernel::Fp8Variant;
// Number of CUDA devices (0 when there is no driver or GPU).
int GpuCount();
// Host in, GPU kernel on device `ordinal`, host out (same contract as QuantizeFp8Block).
absl::Status QuantizeFp8BlockOnGpu(int ordinal, safetensors::DType src_dtype, const void* src,
                                   int64_t rows, int64_t cols, int block_rows, int block_cols,
                                   uint8_t* out_fp8, float* out_scale_inv,
                                   Fp8Variant variant = kernel::kProductionVariant);
// Seconds per quantization of a [rows, cols] matrix of seeded random data already on the
// device (median of `iters` timed launches, after a warm-up, L2 flushed before each).
absl::StatusOr<double> TimeFp8BlockQuantOnGpu(int ordinal, safetensors::DType src_dtype,
                                              int64_t rows, int64_t cols, int iters,
                                              Fp8Variant variant = kernel::kProductionVariant);

}  // namespace weightcache::load::internal
