// internal/fp8_quant_cuda_testing.h over fp8_quant_testing.cu (library load_testing).
#include "pkg/load/internal/fp8_kernel_testing.h"
#include "pkg/load/internal/fp8_quant_cuda.h"
#include "pkg/load/internal/fp8_quant_cuda_testing.h"

namespace weightcache::load::internal {

int GpuCount() {
  int n = 0;
  kernel::DeviceCount(&n);
  return n;
}

absl::Status QuantizeFp8BlockOnGpu(int ordinal, safetensors::DType src_dtype, const void* src,
                                   int64_t rows, int64_t cols, int block_rows, int block_cols,
                                   uint8_t* out_fp8, float* out_scale_inv, Fp8Variant variant) {
  if (auto st = CheckFp8Args(src_dtype, rows, cols, block_rows, block_cols); !st.ok()) return st;
  if (rows == 0 || cols == 0) return absl::OkStatus();
  return Fp8CudaStatus(
      kernel::QuantizeOnDevice(variant, ordinal, src_dtype == safetensors::DType::kBF16, src, rows,
                               cols, block_rows, block_cols, out_fp8, out_scale_inv),
      "fp8 block quantization on the GPU");
}

absl::StatusOr<double> TimeFp8BlockQuantOnGpu(int ordinal, safetensors::DType src_dtype,
                                              int64_t rows, int64_t cols, int iters,
                                              Fp8Variant variant) {
  if (auto st = CheckFp8Args(src_dtype, rows, cols, 128, 128); !st.ok()) return st;
  double s = 0;
  const int rc = kernel::TimeOnDevice(variant, ordinal, src_dtype == safetensors::DType::kBF16,
                                      rows, cols, iters, &s);
  if (rc != 0) return Fp8CudaStatus(rc, "fp8 quantization benchmark");
  return s;
}

}  // namespace weightcache::load::internal
