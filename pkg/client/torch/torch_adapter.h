// libtorch adapter: the tensors of a lease as zero-copy torch tensors.
//
//   WC_ASSIGN_OR_RETURN(std::shared_ptr<client::Lease> lease, client->Acquire(o));
//   WC_ASSIGN_OR_RETURN(auto weights, client::ToTorch(lease));  // name -> at::Tensor
//   lease.reset();  // fine: every tensor keeps the lease (and its mapping) alive
//
// Each tensor is at::from_blob over the lease's mapping, with the manifest's dtype, shape and
// strides, on cuda:N (N = this process's ordinal of the lease's GPU UUID, whatever
// CUDA_VISIBLE_DEVICES is) for cuda-vmm leases, or on the CPU for host leases. Its deleter
// holds a shared_ptr to the Lease, so the mapping (and the lease in the daemon) lives exactly
// as long as the last tensor, or view of one, does.
//
// The memory is READ-ONLY: a kernel write faults (cuda-vmm: cudaErrorIllegalAddress, only in
// this process); on the CPU a write is SIGSEGV. Use the tensors as weights, never in-place.
//
// Thread-safety: may be called from any thread; the tensors may be used and freed from any
// thread. Built only when libtorch is found (CMake target weightcache::client_torch).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "pkg/client/client.h"

namespace weightcache::client {

// The torch dtype of a safetensors dtype. UNIMPLEMENTED naming the dtype and the torch
// version when this libtorch has no such type (e.g. F8_E4M3 before torch 2.1).
absl::StatusOr<c10::ScalarType> TorchDType(safetensors::DType dtype);

// cuda:N for a cuda-vmm lease (NOT_FOUND when its GPU is not visible here), else CPU.
absl::StatusOr<c10::Device> TorchDevice(const Lease& lease);

// The UUID ("GPU-...") of this process's CUDA ordinal, for AcquireOptions::device_uuid
// (NOT_FOUND naming the visible count when there is no such device).
absl::StatusOr<std::string> CudaDeviceUuid(int ordinal);

// Every tensor of the lease, by name.
absl::StatusOr<std::unordered_map<std::string, at::Tensor>> ToTorch(
    std::shared_ptr<const Lease> lease);

// Every tensor of the lease, in manifest (name) order.
absl::StatusOr<std::vector<std::pair<std::string, at::Tensor>>> ToTorchOrdered(
    std::shared_ptr<const Lease> lease);

}  // namespace weightcache::client
