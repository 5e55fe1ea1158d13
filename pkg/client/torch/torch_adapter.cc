#include "pkg/client/torch/torch_adapter.h"

#include <ATen/ops/from_blob.h>
#include <torch/version.h>

#include "absl/strings/str_cat.h"
#include "pkg/memory/internal/cuda_driver.h"
#include "pkg/memory/internal/cuda_segment.h"
#include "pkg/util/status_macros.h"

namespace weightcache::client {

absl::StatusOr<c10::ScalarType> TorchDType(safetensors::DType dtype) {
  using safetensors::DType;
  switch (dtype) {
    case DType::kBool:
      return c10::ScalarType::Bool;
    case DType::kU8:
      return c10::ScalarType::Byte;
    case DType::kI8:
      return c10::ScalarType::Char;
    case DType::kI16:
      return c10::ScalarType::Short;
    case DType::kF16:
      return c10::ScalarType::Half;
    case DType::kBF16:
      return c10::ScalarType::BFloat16;
    case DType::kI32:
      return c10::ScalarType::Int;
    case DType::kF32:
      return c10::ScalarType::Float;
    case DType::kI64:
      return c10::ScalarType::Long;
    case DType::kF64:
      return c10::ScalarType::Double;
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 1)
    case DType::kF8_E4M3:
      return c10::ScalarType::Float8_e4m3fn;
    case DType::kF8_E5M2:
      return c10::ScalarType::Float8_e5m2;
#endif
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
    case DType::kU16:
      return c10::ScalarType::UInt16;
    case DType::kU32:
      return c10::ScalarType::UInt32;
    case DType::kU64:
      return c10::ScalarType::UInt64;
#endif
    default:
      return absl::UnimplementedError(absl::StrCat("dtype ",
                                                   std::string(safetensors::DTypeName(dtype)),
                                                   " has no torch type in torch ", TORCH_VERSION));
  }
}

absl::StatusOr<c10::Device> TorchDevice(const Lease& lease) {
  if (lease.backend() != "cuda-vmm") return c10::Device(c10::DeviceType::CPU);
  WC_ASSIGN_OR_RETURN(int ordinal, memory::internal::CudaOrdinalOfUuid(lease.device_uuid()));
  return c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(ordinal));
}

absl::StatusOr<std::string> CudaDeviceUuid(int ordinal) {
  WC_ASSIGN_OR_RETURN(const memory::internal::DriverApi* api, memory::internal::Driver());
  WC_ASSIGN_OR_RETURN(auto devices, memory::internal::ListDevices(*api));
  for (const auto& d : devices) {
    if (d.ordinal == ordinal) return d.uuid;
  }
  return absl::NotFoundError(absl::StrCat("cuda:", ordinal, ": this process sees ", devices.size(),
                                          " CUDA device(s) that can share memory"));
}

absl::StatusOr<std::vector<std::pair<std::string, at::Tensor>>> ToTorchOrdered(
    std::shared_ptr<const Lease> lease) {  // NOLINT(performance-unnecessary-value-param): API
  if (!lease) return absl::InvalidArgumentError("ToTorch: no lease");
  WC_ASSIGN_OR_RETURN(c10::Device device, TorchDevice(*lease));
  std::vector<std::pair<std::string, at::Tensor>> out;
  out.reserve(lease->tensors().size());
  for (const auto& v : lease->tensors()) {
    auto dtype = TorchDType(v.dtype);
    if (!dtype.ok()) {
      return absl::Status(dtype.status().code(),
                          absl::StrCat("tensor '", v.name, "': ", dtype.status().message()));
    }
    if (v.strides.size() != v.shape.size()) {
      return absl::InternalError(absl::StrCat("manifest: tensor '", v.name, "' has ",
                                              v.shape.size(), " dims but ", v.strides.size(),
                                              " strides"));
    }
    auto options = at::TensorOptions().dtype(*dtype).device(device);
    // The deleter owns a reference to the lease: the mapping outlives every tensor.
    at::Tensor t = at::from_blob(
        const_cast<void*>(v.data), v.shape, v.strides, [keep = lease](void*) {}, options, device);
    if (static_cast<uint64_t>(t.numel()) * t.element_size() != v.nbytes) {
      return absl::InternalError(absl::StrCat("manifest: tensor '", v.name, "' has ", v.nbytes,
                                              " bytes, its shape ", t.numel(), " elements of ",
                                              t.element_size()));
    }
    out.emplace_back(v.name, std::move(t));
  }
  return out;
}

absl::StatusOr<std::unordered_map<std::string, at::Tensor>> ToTorch(
    std::shared_ptr<const Lease> lease) {
  WC_ASSIGN_OR_RETURN(auto ordered, ToTorchOrdered(std::move(lease)));
  std::unordered_map<std::string, at::Tensor> out;
  out.reserve(ordered.size());
  for (auto& [name, t] : ordered) out.emplace(std::move(name), std::move(t));
  return out;
}

}  // namespace weightcache::client
