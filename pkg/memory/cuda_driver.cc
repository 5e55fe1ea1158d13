#include "pkg/memory/internal/cuda_driver.h"

#include <dlfcn.h>

#include <cstdio>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "pkg/util/log.h"

#if CUDA_VERSION < 12000
// CUDA 11.x headers (Debian bookworm's nvidia-cuda-toolkit 11.8, which the Dockerfile's build
// stage uses) lack the query-result type of cuGetProcAddress_v2. Only the type is missing: the
// call itself is fetched from the driver at run time (a >= 12.0 driver, as before). Values as
// in CUDA 12's cuda.h.
typedef enum CUdriverProcAddressQueryResult_enum {
  CU_GET_PROC_ADDRESS_SUCCESS = 0,
  CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND = 1,
  CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT = 2
} CUdriverProcAddressQueryResult;
#endif

namespace weightcache::memory::internal {
namespace {

// cuGetProcAddress as exported by libcuda since CUDA 12.0 (the _v2 ABI, with a query result).
using GetProcAddressFn = CUresult (*)(const char*, void**, int, cuuint64_t,
                                      CUdriverProcAddressQueryResult*);
using DriverGetVersionFn = CUresult (*)(int*);

absl::Status Precondition(const std::string& msg) {
  return absl::FailedPreconditionError(absl::StrCat("CUDA driver not usable: ", msg));
}

absl::StatusOr<const DriverApi*> Load() {
  // RTLD_LOCAL: libcuda's symbols stay out of the global namespace; static cudart (if this
  // process also uses it) dlopen()s the same library and gets the same handle.
  void* lib = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* err = ::dlerror();
    return Precondition(absl::StrCat("dlopen(libcuda.so.1): ", err != nullptr ? err : "failed",
                                     " (no NVIDIA driver on this machine?)"));
  }
  auto get_version = reinterpret_cast<DriverGetVersionFn>(::dlsym(lib, "cuDriverGetVersion"));
  auto get_proc = reinterpret_cast<GetProcAddressFn>(::dlsym(lib, "cuGetProcAddress_v2"));
  if (get_version == nullptr || get_proc == nullptr) {
    return Precondition("libcuda.so.1 has no cuGetProcAddress_v2 (driver older than CUDA 12)");
  }
  auto api = std::make_unique<DriverApi>();
  if (CUresult r = get_version(&api->driver_version); r != CUDA_SUCCESS) {
    return Precondition(absl::StrCat("cuDriverGetVersion: CUresult ", static_cast<int>(r)));
  }
#define WC_CUDA_DRIVER_LOAD_(fn, version)                                                       \
  {                                                                                             \
    void* p = nullptr;                                                                          \
    CUdriverProcAddressQueryResult q = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;                    \
    CUresult r = get_proc(#fn, &p, version, CU_GET_PROC_ADDRESS_DEFAULT, &q);                   \
    if (r != CUDA_SUCCESS || p == nullptr || q != CU_GET_PROC_ADDRESS_SUCCESS) {                \
      return Precondition(absl::StrCat(                                                         \
          "cuGetProcAddress(" #fn ", " #version "): not found (CUresult ", static_cast<int>(r), \
          ", query ", static_cast<int>(q), "); driver ", api->driver_version));                 \
    }                                                                                           \
    api->fn = reinterpret_cast<decltype(api->fn)>(p);                                           \
  }
  WC_CUDA_DRIVER_FUNCTIONS(WC_CUDA_DRIVER_LOAD_)
#undef WC_CUDA_DRIVER_LOAD_
  if (CUresult r = api->cuInit(0); r != CUDA_SUCCESS) {
    return Precondition(
        absl::StrCat("cuInit: ", CuErrorName(*api, r), " (driver ", api->driver_version, ")"));
  }
  return api.release();  // lives for the rest of the process, like libcuda itself
}

absl::StatusCode CodeFor(CUresult r) {
  switch (r) {
    case CUDA_ERROR_OUT_OF_MEMORY:
      return absl::StatusCode::kResourceExhausted;
    case CUDA_ERROR_INVALID_VALUE:
    case CUDA_ERROR_INVALID_HANDLE:
    case CUDA_ERROR_INVALID_DEVICE:
      return absl::StatusCode::kInvalidArgument;
    case CUDA_ERROR_NO_DEVICE:
    case CUDA_ERROR_NOT_INITIALIZED:
    case CUDA_ERROR_DEINITIALIZED:
    case CUDA_ERROR_NOT_SUPPORTED:
    case CUDA_ERROR_SYSTEM_DRIVER_MISMATCH:
    case CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE:
      return absl::StatusCode::kFailedPrecondition;
    case CUDA_ERROR_NOT_PERMITTED:
      return absl::StatusCode::kPermissionDenied;
    default:
      return absl::StatusCode::kInternal;
  }
}

}  // namespace

absl::StatusOr<const DriverApi*> Driver() {
  static const auto* const loaded = new absl::StatusOr<const DriverApi*>(Load());
  return *loaded;
}

std::string CuErrorName(const DriverApi& api, CUresult r) {
  const char* name = nullptr;
  if (api.cuGetErrorName != nullptr && api.cuGetErrorName(r, &name) == CUDA_SUCCESS &&
      name != nullptr) {
    return name;
  }
  return absl::StrCat("CUresult ", static_cast<int>(r));
}

absl::Status CuStatus(const DriverApi& api, CUresult r, const char* call,
                      const std::string& subject) {
  if (r == CUDA_SUCCESS) return absl::OkStatus();
  std::string msg = subject.empty() ? std::string(call) : absl::StrCat(call, "(", subject, ")");
  return absl::Status(CodeFor(r), absl::StrCat(msg, ": ", CuErrorName(api, r)));
}

std::string FormatUuid(const CUuuid& uuid) {
  const auto* b = reinterpret_cast<const unsigned char*>(uuid.bytes);
  char out[64];
  std::snprintf(out, sizeof out,
                "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0],
                b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13],
                b[14], b[15]);
  return out;
}

CUmemAllocationProp AllocationProp(int ordinal) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = ordinal;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  return prop;
}

absl::StatusOr<std::vector<CudaDevice>> ListDevices(const DriverApi& api) {
  int count = 0;
  if (auto s = CuStatus(api, api.cuDeviceGetCount(&count), "cuDeviceGetCount"); !s.ok()) {
    return s;
  }
  std::vector<CudaDevice> out;
  for (int i = 0; i < count; ++i) {
    CudaDevice d;
    d.ordinal = i;
    std::string which = absl::StrCat("ordinal ", i);
    if (auto s = CuStatus(api, api.cuDeviceGet(&d.device, i), "cuDeviceGet", which); !s.ok()) {
      return s;
    }
    CUuuid uuid{};
    if (auto s = CuStatus(api, api.cuDeviceGetUuid(&uuid, d.device), "cuDeviceGetUuid", which);
        !s.ok()) {
      return s;
    }
    d.uuid = FormatUuid(uuid);
    char name[256] = {};
    if (auto s = CuStatus(api, api.cuDeviceGetName(name, sizeof name - 1, d.device),
                          "cuDeviceGetName", d.uuid);
        !s.ok()) {
      return s;
    }
    d.name = name;
    int vmm = 0, fd_handles = 0;
    api.cuDeviceGetAttribute(&d.cc_major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, d.device);
    api.cuDeviceGetAttribute(&d.cc_minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, d.device);
    api.cuDeviceGetAttribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
                             d.device);
    api.cuDeviceGetAttribute(
        &fd_handles, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, d.device);
    if (vmm == 0 || fd_handles == 0) {
      WC_LOG_WARN("cuda-vmm: skipping %s (%s): virtual memory management %s, POSIX FD handles %s",
                  d.uuid, d.name, vmm ? "yes" : "no", fd_handles ? "yes" : "no");
      continue;
    }
    size_t total = 0;
    if (auto s = CuStatus(api, api.cuDeviceTotalMem(&total, d.device), "cuDeviceTotalMem", d.uuid);
        !s.ok()) {
      return s;
    }
    d.total_bytes = total;
    CUmemAllocationProp prop = AllocationProp(i);
    size_t gran = 0;
    if (auto s = CuStatus(
            api, api.cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
            "cuMemGetAllocationGranularity", d.uuid);
        !s.ok()) {
      return s;
    }
    d.granularity = gran;
    out.push_back(std::move(d));
  }
  return out;
}

absl::StatusOr<CudaDevice> FindDevice(const DriverApi& api, const std::string& uuid) {
  auto devices = ListDevices(api);
  if (!devices.ok()) return devices.status();
  std::vector<std::string> seen;
  for (auto& d : *devices) {
    if (d.uuid == uuid) return d;
    seen.push_back(d.uuid);
  }
  return absl::NotFoundError(
      absl::StrCat("GPU ", uuid, " is not visible to this process (visible: ",
                   seen.empty() ? std::string("none") : absl::StrJoin(seen, ", "), ")"));
}

// --- PrimaryContext ----------------------------------------------------------------------

absl::StatusOr<PrimaryContext> PrimaryContext::Retain(const DriverApi& api, CUdevice device) {
  PrimaryContext p;
  CUresult r = api.cuDevicePrimaryCtxRetain(&p.ctx_, device);
  if (r != CUDA_SUCCESS) {
    return CuStatus(api, r, "cuDevicePrimaryCtxRetain", absl::StrCat("device ", device));
  }
  p.api_ = &api;
  p.device_ = device;
  return p;
}

PrimaryContext& PrimaryContext::operator=(PrimaryContext&& o) noexcept {
  if (this != &o) {
    reset();
    api_ = std::exchange(o.api_, nullptr);
    device_ = o.device_;
    ctx_ = std::exchange(o.ctx_, nullptr);
  }
  return *this;
}

void PrimaryContext::reset() {
  if (ctx_ != nullptr && api_ != nullptr) {
    if (CUresult r = api_->cuDevicePrimaryCtxRelease(device_); r != CUDA_SUCCESS) {
      WC_LOG_ERROR("cuDevicePrimaryCtxRelease(device %d): %s", device_, CuErrorName(*api_, r));
    }
  }
  ctx_ = nullptr;
  api_ = nullptr;
}

// --- ScopedCurrentContext ------------------------------------------------------------------

absl::StatusOr<ScopedCurrentContext> ScopedCurrentContext::Push(const DriverApi& api,
                                                                CUcontext ctx) {
  if (CUresult r = api.cuCtxPushCurrent(ctx); r != CUDA_SUCCESS) {
    return CuStatus(api, r, "cuCtxPushCurrent");
  }
  return ScopedCurrentContext(&api);
}

ScopedCurrentContext::~ScopedCurrentContext() {
  if (api_ == nullptr) return;
  CUcontext popped = nullptr;
  if (CUresult r = api_->cuCtxPopCurrent(&popped); r != CUDA_SUCCESS) {
    WC_LOG_ERROR("cuCtxPopCurrent: %s", CuErrorName(*api_, r));
  }
}

// --- AllocationHandle ----------------------------------------------------------------------

AllocationHandle& AllocationHandle::operator=(AllocationHandle&& o) noexcept {
  if (this != &o) {
    reset();
    api_ = std::exchange(o.api_, nullptr);
    h_ = std::exchange(o.h_, 0);
  }
  return *this;
}

void AllocationHandle::reset() {
  if (h_ != 0 && api_ != nullptr) {
    if (CUresult r = api_->cuMemRelease(h_); r != CUDA_SUCCESS) {
      WC_LOG_ERROR("cuMemRelease: %s", CuErrorName(*api_, r));
    }
  }
  h_ = 0;
  api_ = nullptr;
}

// --- VaReservation -------------------------------------------------------------------------

absl::StatusOr<VaReservation> VaReservation::Reserve(const DriverApi& api, size_t size,
                                                     size_t alignment) {
  VaReservation v;
  CUresult r = api.cuMemAddressReserve(&v.ptr_, size, alignment, 0, 0);
  if (r != CUDA_SUCCESS) {
    return CuStatus(api, r, "cuMemAddressReserve", absl::StrCat(size, " bytes"));
  }
  v.api_ = &api;
  v.size_ = size;
  return v;
}

VaReservation& VaReservation::operator=(VaReservation&& o) noexcept {
  if (this != &o) {
    reset();
    api_ = std::exchange(o.api_, nullptr);
    ptr_ = std::exchange(o.ptr_, 0);
    size_ = o.size_;
  }
  return *this;
}

void VaReservation::reset() {
  if (ptr_ != 0 && api_ != nullptr) {
    if (CUresult r = api_->cuMemAddressFree(ptr_, size_); r != CUDA_SUCCESS) {
      WC_LOG_ERROR("cuMemAddressFree(%d bytes): %s", size_, CuErrorName(*api_, r));
    }
  }
  ptr_ = 0;
  api_ = nullptr;
}

// --- MappedRange ---------------------------------------------------------------------------

absl::StatusOr<MappedRange> MappedRange::Map(const DriverApi& api, CUdeviceptr ptr, size_t size,
                                             CUmemGenericAllocationHandle handle) {
  CUresult r = api.cuMemMap(ptr, size, 0, handle, 0);
  if (r != CUDA_SUCCESS) return CuStatus(api, r, "cuMemMap", absl::StrCat(size, " bytes"));
  MappedRange m;
  m.api_ = &api;
  m.ptr_ = ptr;
  m.size_ = size;
  return m;
}

MappedRange& MappedRange::operator=(MappedRange&& o) noexcept {
  if (this != &o) {
    reset();
    api_ = std::exchange(o.api_, nullptr);
    ptr_ = std::exchange(o.ptr_, 0);
    size_ = o.size_;
  }
  return *this;
}

void MappedRange::reset() {
  if (ptr_ != 0 && api_ != nullptr) {
    if (CUresult r = api_->cuMemUnmap(ptr_, size_); r != CUDA_SUCCESS) {
      WC_LOG_ERROR("cuMemUnmap(%d bytes): %s", size_, CuErrorName(*api_, r));
    }
  }
  ptr_ = 0;
  api_ = nullptr;
}

absl::Status SetAccess(const DriverApi& api, CUdeviceptr ptr, size_t size, int ordinal,
                       CUmemAccess_flags flags) {
  CUmemAccessDesc desc{};
  desc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  desc.location.id = ordinal;
  desc.flags = flags;
  return CuStatus(
      api, api.cuMemSetAccess(ptr, size, &desc, 1), "cuMemSetAccess",
      absl::StrCat(size, " bytes, ",
                   flags == CU_MEM_ACCESS_FLAGS_PROT_READ ? "read-only" : "read-write"));
}

}  // namespace weightcache::memory::internal
