// The CUDA side of online block-FP8 quantization, as plain functions returning cudaError_t
// values (0 = success), so that fp8_quant.cu needs neither abseil nor any weightcache header
// but internal/fp8_math.h; fp8_quant_gpu.cc wraps them into internal/fp8_quant_cuda.h.
// Private to pkg/load. Thread-safety: as the CUDA runtime (current context per thread).
#pragma once

#include <cstdint>

namespace weightcache::load::internal::kernel {

// The fast (128x128) kernel's per-element paths, fp8_quant.cu's header says which is which.
// Production uses kProductionVariant; tests and the benchmark run all of them
// (fp8_kernel_testing.h).
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

}  // namespace weightcache::load::internal::kernel
