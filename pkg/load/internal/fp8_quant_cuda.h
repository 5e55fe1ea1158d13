// Online block-FP8 quantization on the GPU (fp8_quant.cu; private to pkg/load, its GPU tests
// and benchmark). Free of CUDA headers: streams are passed as void* (a CUstream /
// cudaStream_t), device memory as plain pointers. Built only in CUDA builds; the kernel
// computes exactly what QuantizeFp8Block (fp8_quant.h) computes on the CPU: both compile
// the per-element maths of internal/fp8_math.h.
//
// Every call runs in the CUDA context current on the calling thread (the loader pushes the
// device's primary context; the test helpers of fp8_quant_cuda_testing.h select the device
// themselves).
// Thread-safety: functions are safe from any thread; a DeviceBuffer is owned by one thread.
#pragma once

#include <cstdint>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "pkg/load/internal/fp8_kernel.h"
#include "pkg/safetensors/safetensors.h"

namespace weightcache::load::internal {

struct Fp8QuantArgs {
  safetensors::DType src_dtype = safetensors::DType::kBF16;  // BF16 or F16
  const void* src = nullptr;  // device: rows * cols elements, row-major
  int64_t rows = 0;
  int64_t cols = 0;
  int block_rows = 128;
  int block_cols = 128;
  uint8_t* out_fp8 = nullptr;      // device: rows * cols codes
  float* out_scale_inv = nullptr;  // device: ceil(rows/br) * ceil(cols/bc) floats
};

// Queues the quantization on `stream` (null: the legacy default stream). INVALID_ARGUMENT for
// a bad dtype or shape; the CUDA error of the launch otherwise. Does not wait.
absl::Status LaunchFp8BlockQuant(const Fp8QuantArgs& args, void* stream);

// Queues a host->device copy on `stream` (host memory pinned for it to be asynchronous).
absl::Status CopyToDeviceAsync(void* dst, const void* src, uint64_t n, void* stream);

// Device memory (cudaMalloc / cudaFree in the current context). Move-only.
class DeviceBuffer {
 public:
  static absl::StatusOr<DeviceBuffer> Allocate(uint64_t bytes);
  DeviceBuffer() = default;
  DeviceBuffer(DeviceBuffer&& o) noexcept : p_(std::exchange(o.p_, nullptr)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer();
  void* get() const { return p_; }

 private:
  explicit DeviceBuffer(void* p) : p_(p) {}
  void* p_ = nullptr;
};

// The CUDA error `rc` of `call` as a status (OK for 0); the argument check of the entry
// points (INVALID_ARGUMENT naming the dtype or shape).
absl::Status Fp8CudaStatus(int rc, const char* call);
absl::Status CheckFp8Args(safetensors::DType dtype, int64_t rows, int64_t cols, int br, int bc);

}  // namespace weightcache::load::internal
