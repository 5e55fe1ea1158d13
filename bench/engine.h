// What a benchmark's engine does, shared by gpu_acquire_bench and concurrency_bench (one
// engine in the bench process; 64 engine processes): the engine's own CUDA setup, then
// Acquire -> every tensor mapped through the client library (on cuda-vmm the library
// imports each segment FD, maps it into one VA range and sets read-only access).
//
// Thread-safety: one thread at a time. Lifetimes: EngineGpu keeps the device's primary
// context retained until it is destroyed; leases must not outlive the process anyway.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "pkg/client/client.h"

namespace weightcache::bench {

// The engine's own CUDA setup (not weightcache's), each step timed: dlopen libcuda +
// cuGetProcAddress + cuInit, device enumeration, and retaining the primary context of the
// first visible device (the one an engine maps on).
class EngineGpu {
 public:
  // UNIMPLEMENTED in a build without CUDA; FAILED_PRECONDITION without a usable device.
  static absl::StatusOr<std::unique_ptr<EngineGpu>> Open();
  ~EngineGpu();
  EngineGpu(const EngineGpu&) = delete;
  EngineGpu& operator=(const EngineGpu&) = delete;

  const std::string& uuid() const { return uuid_; }
  const std::string& name() const { return name_; }
  double driver_ms() const { return driver_ms_; }
  double enumerate_ms() const { return enumerate_ms_; }
  double context_ms() const { return context_ms_; }

 private:
  struct Context;  // the retained primary context (engine_gpu.cc)
  EngineGpu() = default;
  std::string uuid_, name_;
  double driver_ms_ = 0, enumerate_ms_ = 0, context_ms_ = 0;
  std::unique_ptr<Context> context_;
};

// Acquire -> every tensor mapped: the lease, once the client library has mapped every
// segment and built a view per tensor; INTERNAL when a view has no address or the lease
// holds another count of tensors than `expect_tensors` (when > 0).
inline absl::StatusOr<std::unique_ptr<client::Lease>> AcquireMapped(
    client::Client& client, const client::AcquireOptions& options, size_t expect_tensors = 0) {
  auto lease = client.Acquire(options);
  if (!lease.ok()) return lease.status();
  const auto& views = (*lease)->tensors();
  if (expect_tensors > 0 && views.size() != expect_tensors) {
    return absl::InternalError("lease of " + options.model + " has " +
                               std::to_string(views.size()) + " tensors, expected " +
                               std::to_string(expect_tensors));
  }
  for (const auto& v : views) {
    if (v.data == nullptr) return absl::InternalError("tensor " + v.name + " is not mapped");
  }
  return lease;
}

}  // namespace weightcache::bench
