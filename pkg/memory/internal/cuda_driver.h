// The CUDA driver API, fetched at run time, and move-only owners of driver resources.
//
// weightcache never links libcuda: Driver() dlopen()s libcuda.so.1 once per process, asks
// cuGetProcAddress for every entry point listed below and calls cuInit. On a machine with no
// driver (or no GPU) it answers FAILED_PRECONDITION naming the cause, so the binary still
// starts and serves the host backend.
//
// Private to pkg/memory and its tests/benchmarks (pkg/load may use it for its GPU paths).
// Thread-safety: Driver() may be called from any thread; the table it returns is immutable
// and lives until the process exits (libcuda is never unloaded). The owner types are values:
// one owner at a time, like ScopedFd.
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace weightcache::memory::internal {

// Every driver entry point weightcache uses, each pinned to one ABI version: the member has
// that version's type from cudaTypedefs.h and cuGetProcAddress is asked for exactly that
// version. (Asking for "the newest" is a trap: at 13000, cuCtxSynchronize is the v13000
// variant that takes a CUcontext, while cuda.h still declares the old one.)
#define WC_CUDA_DRIVER_FUNCTIONS(X)        \
  X(cuInit, 2000)                          \
  X(cuDriverGetVersion, 2020)              \
  X(cuGetErrorName, 6000)                  \
  X(cuDeviceGetCount, 2000)                \
  X(cuDeviceGet, 2000)                     \
  X(cuDeviceGetName, 2000)                 \
  X(cuDeviceGetUuid, 11040)                \
  X(cuDeviceGetAttribute, 2000)            \
  X(cuDeviceTotalMem, 3020)                \
  X(cuDevicePrimaryCtxRetain, 7000)        \
  X(cuDevicePrimaryCtxRelease, 11000)      \
  X(cuCtxPushCurrent, 4000)                \
  X(cuCtxPopCurrent, 4000)                 \
  X(cuCtxSynchronize, 2000)                \
  X(cuMemGetInfo, 3020)                    \
  X(cuMemGetAllocationGranularity, 10020)  \
  X(cuMemCreate, 10020)                    \
  X(cuMemRelease, 10020)                   \
  X(cuMemExportToShareableHandle, 10020)   \
  X(cuMemImportFromShareableHandle, 10020) \
  X(cuMemAddressReserve, 10020)            \
  X(cuMemAddressFree, 10020)               \
  X(cuMemMap, 10020)                       \
  X(cuMemUnmap, 10020)                     \
  X(cuMemSetAccess, 10020)                 \
  X(cuMemcpyHtoD, 3020)                    \
  X(cuMemcpyHtoDAsync, 3020)               \
  X(cuMemcpy2DAsync, 3020)                 \
  X(cuMemcpyDtoH, 3020)                    \
  X(cuMemcpyDtoD, 3020)                    \
  X(cuMemsetD8Async, 3020)                 \
  X(cuDeviceCanAccessPeer, 4000)           \
  X(cuMemHostAlloc, 2020)                  \
  X(cuMemFreeHost, 2000)                   \
  X(cuStreamCreate, 2000)                  \
  X(cuStreamSynchronize, 2000)             \
  X(cuStreamDestroy, 4000)                 \
  X(cuEventCreate, 2000)                   \
  X(cuEventRecord, 2000)                   \
  X(cuEventSynchronize, 2000)              \
  X(cuEventDestroy, 4000)

struct DriverApi {
#define WC_CUDA_DRIVER_MEMBER_(fn, version) PFN_##fn##_v##version fn = nullptr;
  WC_CUDA_DRIVER_FUNCTIONS(WC_CUDA_DRIVER_MEMBER_)
#undef WC_CUDA_DRIVER_MEMBER_
  int driver_version = 0;  // e.g. 13000
};

// The process-wide driver table, loaded and initialised (cuInit) on first use.
// FAILED_PRECONDITION with the reason when libcuda is missing, too old, or has no device.
absl::StatusOr<const DriverApi*> Driver();

// "CUDA_ERROR_OUT_OF_MEMORY" (or "CUresult 999" when the driver does not know the code).
std::string CuErrorName(const DriverApi& api, CUresult r);

// OK for CUDA_SUCCESS; else a status whose message is "<call>(<subject>): <CUresult name>"
// (or "<call>: <name>" with no subject) and whose code follows the CUresult
// (OUT_OF_MEMORY -> RESOURCE_EXHAUSTED, INVALID_VALUE -> INVALID_ARGUMENT, ...).
absl::Status CuStatus(const DriverApi& api, CUresult r, const char* call,
                      const std::string& subject = {});

// "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", the form nvidia-smi and CUDA_VISIBLE_DEVICES use.
std::string FormatUuid(const CUuuid& uuid);

// The devices this process can see whose memory can be shared as POSIX file descriptors
// (VMM and POSIX FD handles supported), in ordinal order.
struct CudaDevice {
  CUdevice device = 0;
  int ordinal = -1;
  std::string uuid;
  std::string name;
  int cc_major = 0;
  int cc_minor = 0;
  uint64_t total_bytes = 0;
  uint64_t granularity = 0;  // minimum allocation granularity for a POSIX-FD allocation
};
absl::StatusOr<std::vector<CudaDevice>> ListDevices(const DriverApi& api);
// The device with this UUID among the visible ones (whatever CUDA_VISIBLE_DEVICES is), or
// NOT_FOUND listing the visible UUIDs.
absl::StatusOr<CudaDevice> FindDevice(const DriverApi& api, const std::string& uuid);

// The allocation properties weightcache uses: pinned device memory on `ordinal`, shareable
// as a POSIX file descriptor.
CUmemAllocationProp AllocationProp(int ordinal);

// ---------------------------------------------------------------------------------------
// Move-only owners. Each releases its resource on destruction and logs (never throws) if the
// driver refuses; the empty (default or moved-from) state owns nothing.

// A retained primary context of one device (cuDevicePrimaryCtxRetain / Release).
class PrimaryContext {
 public:
  PrimaryContext() = default;
  static absl::StatusOr<PrimaryContext> Retain(const DriverApi& api, CUdevice device);
  PrimaryContext(PrimaryContext&& o) noexcept
      : api_(std::exchange(o.api_, nullptr)),
        device_(o.device_),
        ctx_(std::exchange(o.ctx_, nullptr)) {}
  PrimaryContext& operator=(PrimaryContext&& o) noexcept;
  PrimaryContext(const PrimaryContext&) = delete;
  PrimaryContext& operator=(const PrimaryContext&) = delete;
  ~PrimaryContext() { reset(); }
  void reset();
  CUcontext get() const { return ctx_; }

 private:
  const DriverApi* api_ = nullptr;
  CUdevice device_ = 0;
  CUcontext ctx_ = nullptr;
};

// Makes a context current on this thread for its scope (cuCtxPushCurrent / cuCtxPopCurrent).
// Not movable: a scope guard.
class ScopedCurrentContext {
 public:
  static absl::StatusOr<ScopedCurrentContext> Push(const DriverApi& api, CUcontext ctx);
  ScopedCurrentContext(ScopedCurrentContext&& o) noexcept : api_(std::exchange(o.api_, nullptr)) {}
  ScopedCurrentContext& operator=(ScopedCurrentContext&&) = delete;
  ScopedCurrentContext(const ScopedCurrentContext&) = delete;
  ~ScopedCurrentContext();

 private:
  explicit ScopedCurrentContext(const DriverApi* api) : api_(api) {}
  const DriverApi* api_ = nullptr;
};

// A physical allocation handle (cuMemCreate or cuMemImportFromShareableHandle / cuMemRelease).
class AllocationHandle {
 public:
  AllocationHandle() = default;
  AllocationHandle(const DriverApi* api, CUmemGenericAllocationHandle h) : api_(api), h_(h) {}
  AllocationHandle(AllocationHandle&& o) noexcept
      : api_(std::exchange(o.api_, nullptr)), h_(std::exchange(o.h_, 0)) {}
  AllocationHandle& operator=(AllocationHandle&& o) noexcept;
  AllocationHandle(const AllocationHandle&) = delete;
  AllocationHandle& operator=(const AllocationHandle&) = delete;
  ~AllocationHandle() { reset(); }
  void reset();
  CUmemGenericAllocationHandle get() const { return h_; }

 private:
  const DriverApi* api_ = nullptr;
  CUmemGenericAllocationHandle h_ = 0;
};

// A reserved virtual address range (cuMemAddressReserve / cuMemAddressFree).
class VaReservation {
 public:
  VaReservation() = default;
  static absl::StatusOr<VaReservation> Reserve(const DriverApi& api, size_t size, size_t alignment);
  VaReservation(VaReservation&& o) noexcept
      : api_(std::exchange(o.api_, nullptr)), ptr_(std::exchange(o.ptr_, 0)), size_(o.size_) {}
  VaReservation& operator=(VaReservation&& o) noexcept;
  VaReservation(const VaReservation&) = delete;
  VaReservation& operator=(const VaReservation&) = delete;
  ~VaReservation() { reset(); }
  void reset();
  CUdeviceptr get() const { return ptr_; }
  size_t size() const { return size_; }

 private:
  const DriverApi* api_ = nullptr;
  CUdeviceptr ptr_ = 0;
  size_t size_ = 0;
};

// One mapped range (cuMemMap / cuMemUnmap). Access rights are set separately (cuMemSetAccess),
// so that a caller can set them once over several neighbouring mappings.
class MappedRange {
 public:
  MappedRange() = default;
  static absl::StatusOr<MappedRange> Map(const DriverApi& api, CUdeviceptr ptr, size_t size,
                                         CUmemGenericAllocationHandle handle);
  MappedRange(MappedRange&& o) noexcept
      : api_(std::exchange(o.api_, nullptr)), ptr_(std::exchange(o.ptr_, 0)), size_(o.size_) {}
  MappedRange& operator=(MappedRange&& o) noexcept;
  MappedRange(const MappedRange&) = delete;
  MappedRange& operator=(const MappedRange&) = delete;
  ~MappedRange() { reset(); }
  void reset();
  CUdeviceptr get() const { return ptr_; }

 private:
  const DriverApi* api_ = nullptr;
  CUdeviceptr ptr_ = 0;
  size_t size_ = 0;
};

// Sets `flags` (CU_MEM_ACCESS_FLAGS_PROT_READ / _READWRITE) for `ordinal` over [ptr, ptr+size).
absl::Status SetAccess(const DriverApi& api, CUdeviceptr ptr, size_t size, int ordinal,
                       CUmemAccess_flags flags);

}  // namespace weightcache::memory::internal
