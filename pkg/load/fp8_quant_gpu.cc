// internal/fp8_quant_cuda.h over the plain kernel entry points of fp8_quant.cu.
#include "absl/strings/str_cat.h"
#include "pkg/load/internal/fp8_kernel.h"
#include "pkg/load/internal/fp8_quant_cuda.h"

namespace weightcache::load::internal {

absl::Status Fp8CudaStatus(int rc, const char* call) {
  if (rc == 0) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(call, ": ", kernel::ErrorName(rc)));
}

absl::Status CheckFp8Args(safetensors::DType dtype, int64_t rows, int64_t cols, int br, int bc) {
  if (dtype != safetensors::DType::kBF16 && dtype != safetensors::DType::kF16) {
    return absl::InvalidArgumentError(
        absl::StrCat("fp8 block quantization on the GPU: source dtype ",
                     std::string(safetensors::DTypeName(dtype)), " is not BF16 or F16"));
  }
  if (rows < 0 || cols < 0 || br <= 0 || bc <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("fp8 block quantization on the GPU: bad shape [",
                                                   rows, ", ", cols, "] or block ", br, "x", bc));
  }
  return absl::OkStatus();
}

absl::Status LaunchFp8BlockQuant(const Fp8QuantArgs& a, void* stream) {
  if (auto st = CheckFp8Args(a.src_dtype, a.rows, a.cols, a.block_rows, a.block_cols); !st.ok()) {
    return st;
  }
  return Fp8CudaStatus(
      kernel::LaunchFp8BlockQuant(a.src_dtype == safetensors::DType::kBF16, a.src, a.rows, a.cols,
                                  a.block_rows, a.block_cols, a.out_fp8, a.out_scale_inv, stream),
      "fp8 block quantization kernel launch");
}

absl::Status CopyToDeviceAsync(void* dst, const void* src, uint64_t n, void* stream) {
  return Fp8CudaStatus(kernel::CopyToDeviceAsync(dst, src, n, stream), "cudaMemcpyAsync");
}

absl::StatusOr<DeviceBuffer> DeviceBuffer::Allocate(uint64_t bytes) {
  void* p = nullptr;
  const int rc = kernel::DeviceAlloc(&p, bytes);
  if (rc != 0) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "cudaMalloc of ", bytes, " bytes of quantization scratch: ", kernel::ErrorName(rc)));
  }
  return DeviceBuffer(p);
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    if (p_ != nullptr) kernel::DeviceFree(p_);
    p_ = std::exchange(o.p_, nullptr);
  }
  return *this;
}

DeviceBuffer::~DeviceBuffer() {
  if (p_ != nullptr) kernel::DeviceFree(p_);
}

}  // namespace weightcache::load::internal
