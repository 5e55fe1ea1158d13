// The cuda-vmm backend (daemon side). Each segment is one cuMemCreate allocation with a
// POSIX file-descriptor handle, exported once at allocation (re-exporting costs ~0.5-0.9 ms;
// the daemon keeps the original FD and senders dup() it). While loading, the daemon maps the
// allocation read-write into its own address space so copies can land in it; Seal() waits
// for every copy and drops that mapping, so nothing in the daemon can write it again.
#include "pkg/memory/cuda_backend.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "pkg/memory/internal/cuda_driver.h"
#include "pkg/memory/internal/cuda_segment.h"
#include "pkg/util/bytes.h"
#include "pkg/util/log.h"
#include "pkg/util/scoped_fd.h"
#include "pkg/util/status_macros.h"

namespace weightcache::memory {
namespace internal {
namespace {

class CudaSegmentImpl final : public CudaSegment {
 public:
  // Allocates, maps read-write for this process and exports the FD. The segment holds its
  // own reference to the device's primary context, so it may outlive the backend.
  static absl::StatusOr<std::unique_ptr<CudaSegmentImpl>> Create(const DriverApi& api,
                                                                 const CudaDevice& dev,
                                                                 uint64_t size,
                                                                 const std::string& label) {
    const std::string where = absl::StrCat(size, " bytes on ", dev.uuid);
    WC_ASSIGN_OR_RETURN(auto ctx, PrimaryContext::Retain(api, dev.device));
    WC_ASSIGN_OR_RETURN(auto current, ScopedCurrentContext::Push(api, ctx.get()));
    CUmemAllocationProp prop = AllocationProp(dev.ordinal);
    CUmemGenericAllocationHandle raw = 0;
    WC_RETURN_IF_ERROR(CuStatus(api, api.cuMemCreate(&raw, size, &prop, 0), "cuMemCreate", where));
    AllocationHandle handle(&api, raw);

    int fd = -1;
    WC_RETURN_IF_ERROR(CuStatus(api,
                                api.cuMemExportToShareableHandle(
                                    &fd, handle.get(), CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
                                "cuMemExportToShareableHandle", where));
    ScopedFd exported(fd);

    WC_ASSIGN_OR_RETURN(auto va, VaReservation::Reserve(api, size, dev.granularity));
    WC_ASSIGN_OR_RETURN(auto mapped, MappedRange::Map(api, va.get(), size, handle.get()));
    WC_RETURN_IF_ERROR(
        SetAccess(api, va.get(), size, dev.ordinal, CU_MEM_ACCESS_FLAGS_PROT_READWRITE));
    // Every byte the daemon does not write (alignment gaps between tensors, the tail up to
    // the granule) must read as zero: it is hashed into the segment's digests and any engine
    // that maps the segment can read it. cuMemCreate promises nothing about the contents
    // (it happens to hand out zeroed memory today), so one memset per segment, on this
    // thread's own stream (no wait on other loads' streams), finished before any copy.
    WC_RETURN_IF_ERROR(CuStatus(api,
                                api.cuMemsetD8Async(mapped.get(), 0, size, CU_STREAM_PER_THREAD),
                                "cuMemsetD8Async", where));
    WC_RETURN_IF_ERROR(CuStatus(api, api.cuStreamSynchronize(CU_STREAM_PER_THREAD),
                                "cuStreamSynchronize (zeroing)", where));
    return std::unique_ptr<CudaSegmentImpl>(
        new CudaSegmentImpl(api, dev, std::move(ctx), size, label, std::move(handle),
                            std::move(exported), std::move(va), std::move(mapped)));
  }

  // An allocation an earlier daemon exported (Backend::Adopt): imported from `fd` (which
  // the segment keeps and shares), sealed, never mapped by this process.
  static absl::StatusOr<std::unique_ptr<CudaSegmentImpl>> Adopt(const DriverApi& api,
                                                                const CudaDevice& dev, ScopedFd fd,
                                                                uint64_t size,
                                                                const std::string& label) {
    if (size == 0 || size % dev.granularity != 0) {
      return absl::InvalidArgumentError(absl::StrCat(label, ": adopted size ", size,
                                                     " is not a multiple of the granularity ",
                                                     dev.granularity, " of ", dev.uuid));
    }
    WC_ASSIGN_OR_RETURN(auto ctx, PrimaryContext::Retain(api, dev.device));
    WC_ASSIGN_OR_RETURN(auto current, ScopedCurrentContext::Push(api, ctx.get()));
    CUmemGenericAllocationHandle raw = 0;
    WC_RETURN_IF_ERROR(CuStatus(api,
                                api.cuMemImportFromShareableHandle(
                                    &raw, reinterpret_cast<void*>(static_cast<uintptr_t>(fd.get())),
                                    CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
                                "cuMemImportFromShareableHandle (adopt)",
                                absl::StrCat(label, " on ", dev.uuid)));
    auto seg = std::unique_ptr<CudaSegmentImpl>(
        new CudaSegmentImpl(api, dev, std::move(ctx), size, label, AllocationHandle(&api, raw),
                            std::move(fd), VaReservation(), MappedRange()));
    seg->sealed_ = true;
    return seg;
  }

  ~CudaSegmentImpl() override {
    // Unmap, free the VA range, then release the handle; the exported FD (and any dup a
    // client or the keeper holds) keeps the physical memory alive on its own.
    auto current = ScopedCurrentContext::Push(*api_, ctx_.get());
    DropDaemonMapping();
    handle_.reset();
  }

  uint64_t size() const override { return size_; }
  std::byte* host_data() override { return nullptr; }

  absl::Status CopyIn(uint64_t offset, const void* src, size_t n) override {
    WC_RETURN_IF_ERROR(CheckWritable(offset, n));
    if (n == 0) return absl::OkStatus();
    WC_ASSIGN_OR_RETURN(auto current, ScopedCurrentContext::Push(*api_, ctx_.get()));
    return CuStatus(*api_, api_->cuMemcpyHtoD(mapped_.get() + offset, src, n), "cuMemcpyHtoD",
                    absl::StrCat(label_, " +", offset, ", ", n, " bytes"));
  }

  absl::Status CopyInAsync(uint64_t offset, const void* src, size_t n,
                           CUstream_st* stream) override {
    WC_RETURN_IF_ERROR(CheckWritable(offset, n));
    if (n == 0) return absl::OkStatus();
    WC_ASSIGN_OR_RETURN(auto current, ScopedCurrentContext::Push(*api_, ctx_.get()));
    return CuStatus(*api_, api_->cuMemcpyHtoDAsync(mapped_.get() + offset, src, n, stream),
                    "cuMemcpyHtoDAsync", absl::StrCat(label_, " +", offset, ", ", n, " bytes"));
  }

  absl::Status Seal() override {
    if (sealed_) return absl::OkStatus();
    {
      WC_ASSIGN_OR_RETURN(auto current, ScopedCurrentContext::Push(*api_, ctx_.get()));
      // Every copy queued into this segment (on any stream of the context) must land first.
      WC_RETURN_IF_ERROR(CuStatus(*api_, api_->cuCtxSynchronize(), "cuCtxSynchronize",
                                  absl::StrCat("seal ", label_)));
    }
    DropDaemonMapping();
    sealed_ = true;
    return absl::OkStatus();
  }

  bool sealed() const override { return sealed_; }
  int fd() const override { return fd_.get(); }
  const std::string& device_uuid() const override { return device_uuid_; }

  void* device_ptr() override {
    return sealed_ ? nullptr : reinterpret_cast<void*>(static_cast<uintptr_t>(mapped_.get()));
  }
  int device_ordinal() const override { return ordinal_; }

  // For CopySegment: the allocation (kept until destruction, also after Seal) and the
  // primary context the segment holds.
  CUmemGenericAllocationHandle allocation() const { return handle_.get(); }
  CUcontext context() const { return ctx_.get(); }
  CUdeviceptr writable() const { return sealed_ ? 0 : mapped_.get(); }
  const std::string& label() const { return label_; }

 private:
  CudaSegmentImpl(const DriverApi& api, const CudaDevice& dev, PrimaryContext ctx, uint64_t size,
                  std::string label, AllocationHandle handle, ScopedFd fd, VaReservation va,
                  MappedRange mapped)
      : api_(&api),
        ctx_(std::move(ctx)),
        ordinal_(dev.ordinal),
        device_uuid_(dev.uuid),
        size_(size),
        label_(std::move(label)),
        handle_(std::move(handle)),
        fd_(std::move(fd)),
        va_(std::move(va)),
        mapped_(std::move(mapped)) {}

  absl::Status CheckWritable(uint64_t offset, size_t n) const {
    if (sealed_) return absl::FailedPreconditionError(absl::StrCat(label_, ": sealed"));
    if (offset > size_ || n > size_ - offset) {
      return absl::OutOfRangeError(absl::StrCat(label_, ": write [", offset, ", +", n,
                                                ") outside segment of ", size_, " bytes"));
    }
    return absl::OkStatus();
  }

  void DropDaemonMapping() {
    mapped_.reset();  // cuMemUnmap
    va_.reset();      // cuMemAddressFree
  }

  const DriverApi* api_;
  PrimaryContext ctx_;  // first member: released last
  int ordinal_;
  std::string device_uuid_;
  uint64_t size_;
  std::string label_;
  AllocationHandle handle_;
  ScopedFd fd_;  // exported once; shared (as dup()s) with clients and the keeper
  VaReservation va_;
  MappedRange mapped_;
  bool sealed_ = false;
};

// Pinned host memory (cuMemHostAlloc / cuMemFreeHost), for host-staged copies.
class PinnedBuffer {
 public:
  static absl::StatusOr<PinnedBuffer> Alloc(const DriverApi& api, size_t n) {
    void* p = nullptr;
    WC_RETURN_IF_ERROR(
        CuStatus(api, api.cuMemHostAlloc(&p, n, 0), "cuMemHostAlloc", absl::StrCat(n, " bytes")));
    return PinnedBuffer(&api, p, n);
  }
  PinnedBuffer(PinnedBuffer&& o) noexcept
      : api_(std::exchange(o.api_, nullptr)), p_(std::exchange(o.p_, nullptr)), n_(o.n_) {}
  PinnedBuffer& operator=(PinnedBuffer&&) = delete;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  ~PinnedBuffer() {
    if (p_ != nullptr) api_->cuMemFreeHost(p_);
  }
  void* get() const { return p_; }
  size_t size() const { return n_; }

 private:
  PinnedBuffer(const DriverApi* api, void* p, size_t n) : api_(api), p_(p), n_(n) {}
  const DriverApi* api_;
  void* p_;
  size_t n_;
};

class CudaBackend final : public Backend {
 public:
  CudaBackend(const DriverApi& api, std::vector<CudaDevice> devices,
              const CudaBackendOptions& options)
      : api_(&api), devices_(std::move(devices)), options_(options) {
    for (const auto& d : devices_) granularity_ = std::max<uint64_t>(granularity_, d.granularity);
  }

  BackendKind kind() const override { return BackendKind::kCudaVmm; }
  uint64_t granularity() const override { return granularity_; }
  uint64_t max_segment_bytes() const override { return options_.max_segment_bytes; }

  std::vector<DeviceInfo> Devices() const override {
    std::vector<DeviceInfo> out;
    for (const auto& d : devices_) {
      DeviceInfo info;
      info.uuid = d.uuid;
      info.ordinal = d.ordinal;
      info.name = d.name;
      info.compute_capability = absl::StrCat("sm_", d.cc_major, d.cc_minor);
      info.total_bytes = d.total_bytes;
      auto free_bytes = FreeBytes(d);
      if (free_bytes.ok()) {
        info.free_bytes = *free_bytes;
      } else {
        WC_LOG_WARN("cuda-vmm: free memory of %s unknown: %s", d.uuid,
                    std::string(free_bytes.status().message()));
      }
      out.push_back(std::move(info));
    }
    return out;
  }

  absl::StatusOr<std::unique_ptr<Segment>> Allocate(const std::string& device_uuid, uint64_t size,
                                                    const std::string& label) override {
    if (size == 0) return absl::InvalidArgumentError(absl::StrCat(label, ": empty segment"));
    const CudaDevice* dev = Find(device_uuid);
    if (dev == nullptr) {
      std::string seen;
      for (const auto& d : devices_) absl::StrAppend(&seen, seen.empty() ? "" : ", ", d.uuid);
      return absl::InvalidArgumentError(absl::StrCat("cuda-vmm backend: device '", device_uuid,
                                                     "' is not available (devices: ", seen, ")"));
    }
    // Keeps the primary context alive between allocations (creating one costs ~0.2-0.3 s).
    WC_ASSIGN_OR_RETURN(CUcontext ctx, ContextFor(*dev));
    (void)ctx;
    auto seg = CudaSegmentImpl::Create(*api_, *dev, RoundUp(size, dev->granularity), label);
    if (!seg.ok()) return Annotate(seg.status(), label);
    return std::unique_ptr<Segment>(std::move(seg).value());
  }

  absl::StatusOr<std::unique_ptr<Segment>> Adopt(const std::string& device_uuid, ScopedFd fd,
                                                 uint64_t size, const std::string& label) override {
    const CudaDevice* dev = FindExact(device_uuid);
    if (dev == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(label, ": adopted on device '", device_uuid,
                                                     "', which this node does not have now"));
    }
    WC_ASSIGN_OR_RETURN(CUcontext ctx, ContextFor(*dev));
    (void)ctx;
    auto seg = CudaSegmentImpl::Adopt(*api_, *dev, std::move(fd), size, label);
    if (!seg.ok()) return seg.status();
    return std::unique_ptr<Segment>(std::move(seg).value());
  }

  bool CanAccessPeer(const std::string& src_uuid, const std::string& dst_uuid) const override {
    const CudaDevice* src = FindExact(src_uuid);
    const CudaDevice* dst = FindExact(dst_uuid);
    if (src == nullptr || dst == nullptr) return false;
    if (src->ordinal == dst->ordinal) return true;
    int can = 0;
    if (api_->cuDeviceCanAccessPeer(&can, dst->device, src->device) != CUDA_SUCCESS) return false;
    return can != 0;
  }

  // The source allocation (sealed: the daemon no longer maps it) is mapped again, read-only,
  // into a temporary VA range; kPeer grants the destination GPU read access to it
  // (cuMemSetAccess is how VMM memory gets peer access) and copies with cuMemcpyDtoD in the
  // destination's context (its copy engines pull over NVLink/PCIe); kHostStaged goes
  // device -> pinned buffer -> device. Both in kCopyChunkBytes chunks, `tick` before each
  // (peer chunks are queued without a wait between them: NVLink keeps its bandwidth).
  absl::Status CopySegment(Segment& src_seg, Segment* dst_seg, CopyRoute route,
                           const CopyTick& tick) override {
    auto* src = dynamic_cast<CudaSegmentImpl*>(&src_seg);
    auto* dst = dynamic_cast<CudaSegmentImpl*>(dst_seg);
    if (src == nullptr || dst == nullptr) {
      return absl::InvalidArgumentError("cuda-vmm backend: CopySegment of a foreign segment");
    }
    if (dst->writable() == 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("cuda-vmm backend: CopySegment into sealed ", dst->label()));
    }
    const uint64_t n = src->size();
    if (dst->size() < n) {
      return absl::InvalidArgumentError(
          absl::StrCat("cuda-vmm backend: CopySegment of ", n, " bytes into ", dst->size()));
    }
    const std::string what =
        absl::StrCat(src->label(), " (", src->device_uuid(), ") -> ", dst->label(), " (",
                     dst->device_uuid(), "), ", n, " bytes, route ", CopyRouteName(route));
    const CudaDevice* sdev = FindExact(src->device_uuid());
    const CudaDevice* ddev = FindExact(dst->device_uuid());
    if (sdev == nullptr || ddev == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("cuda-vmm backend: ", what, ": unknown device"));
    }
    if (route == CopyRoute::kPeer && !CanAccessPeer(src->device_uuid(), dst->device_uuid())) {
      return absl::FailedPreconditionError(absl::StrCat(
          "cuda-vmm backend: ", dst->device_uuid(), " cannot access ", src->device_uuid(),
          " (cuDeviceCanAccessPeer: 0); copy host-staged instead"));
    }
    // A read-only mapping of the source for this copy.
    VaReservation va;
    MappedRange mapped;
    {
      WC_ASSIGN_OR_RETURN(auto current, ScopedCurrentContext::Push(*api_, src->context()));
      WC_ASSIGN_OR_RETURN(va, VaReservation::Reserve(*api_, n, sdev->granularity));
      WC_ASSIGN_OR_RETURN(mapped, MappedRange::Map(*api_, va.get(), n, src->allocation()));
      WC_RETURN_IF_ERROR(
          SetAccess(*api_, mapped.get(), n, sdev->ordinal, CU_MEM_ACCESS_FLAGS_PROT_READ));
      if (route == CopyRoute::kPeer && ddev->ordinal != sdev->ordinal) {
        WC_RETURN_IF_ERROR(
            SetAccess(*api_, mapped.get(), n, ddev->ordinal, CU_MEM_ACCESS_FLAGS_PROT_READ));
      }
    }
    auto stopped = [&](uint64_t off) {
      return absl::CancelledError(
          absl::StrCat("cuda-vmm backend: ", what, ": stopped after ", off, " bytes"));
    };
    auto copy = [&]() -> absl::Status {
      if (route == CopyRoute::kPeer) {
        WC_ASSIGN_OR_RETURN(auto current, ScopedCurrentContext::Push(*api_, dst->context()));
        absl::Status queued = absl::OkStatus();
        for (uint64_t off = 0; off < n && queued.ok(); off += kCopyChunkBytes) {
          if (tick && !tick(off)) {
            queued = stopped(off);
            break;
          }
          const size_t chunk = std::min<uint64_t>(kCopyChunkBytes, n - off);
          queued =
              CuStatus(*api_, api_->cuMemcpyDtoD(dst->writable() + off, mapped.get() + off, chunk),
                       "cuMemcpyDtoD", what);
        }
        // Whatever was queued completes before the source mapping goes.
        absl::Status synced = CuStatus(*api_, api_->cuCtxSynchronize(), "cuCtxSynchronize", what);
        return queued.ok() ? synced : queued;
      }
      // The source context stays current for the pinned buffer's whole life (alloc and free).
      WC_ASSIGN_OR_RETURN(auto src_current, ScopedCurrentContext::Push(*api_, src->context()));
      WC_ASSIGN_OR_RETURN(auto pinned,
                          PinnedBuffer::Alloc(*api_, std::min<uint64_t>(n, kCopyChunkBytes)));
      for (uint64_t off = 0; off < n; off += pinned.size()) {
        if (tick && !tick(off)) return stopped(off);
        const size_t chunk = std::min<uint64_t>(pinned.size(), n - off);
        WC_RETURN_IF_ERROR(CuStatus(*api_,
                                    api_->cuMemcpyDtoH(pinned.get(), mapped.get() + off, chunk),
                                    "cuMemcpyDtoH", what));
        WC_ASSIGN_OR_RETURN(auto current, ScopedCurrentContext::Push(*api_, dst->context()));
        WC_RETURN_IF_ERROR(CuStatus(*api_,
                                    api_->cuMemcpyHtoD(dst->writable() + off, pinned.get(), chunk),
                                    "cuMemcpyHtoD", what));
      }
      return absl::OkStatus();
    };
    absl::Status st = copy();
    // Unmap the temporary source mapping with its context current, as ~CudaSegmentImpl does.
    auto current = ScopedCurrentContext::Push(*api_, src->context());
    mapped.reset();
    va.reset();
    return st;
  }

 private:
  const CudaDevice* FindExact(const std::string& uuid) const {
    for (const auto& d : devices_) {
      if (d.uuid == uuid) return &d;
    }
    return nullptr;
  }

  const CudaDevice* Find(const std::string& uuid) const {
    if (uuid.empty()) return devices_.empty() ? nullptr : &devices_.front();
    for (const auto& d : devices_) {
      if (d.uuid == uuid) return &d;
    }
    return nullptr;
  }

  // The device's primary context, retained on first use and kept for the backend's life
  // (segments use it until they are sealed).
  absl::StatusOr<CUcontext> ContextFor(const CudaDevice& d) const {
    absl::MutexLock lock(&mu_);
    auto it = contexts_.find(d.ordinal);
    if (it == contexts_.end()) {
      WC_ASSIGN_OR_RETURN(auto ctx, PrimaryContext::Retain(*api_, d.device));
      it = contexts_.emplace(d.ordinal, std::move(ctx)).first;
    }
    return it->second.get();
  }

  absl::StatusOr<uint64_t> FreeBytes(const CudaDevice& d) const {
    WC_ASSIGN_OR_RETURN(CUcontext ctx, ContextFor(d));
    WC_ASSIGN_OR_RETURN(auto current, ScopedCurrentContext::Push(*api_, ctx));
    size_t free_bytes = 0, total = 0;
    WC_RETURN_IF_ERROR(
        CuStatus(*api_, api_->cuMemGetInfo(&free_bytes, &total), "cuMemGetInfo", d.uuid));
    return free_bytes;
  }

  const DriverApi* api_;
  std::vector<CudaDevice> devices_;
  CudaBackendOptions options_;
  uint64_t granularity_ = 2ull << 20;
  mutable absl::Mutex mu_;
  mutable std::map<int, PrimaryContext> contexts_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

CudaSegment* AsCudaSegment(Segment* s) { return dynamic_cast<CudaSegment*>(s); }

absl::StatusOr<int> CudaOrdinalOfUuid(const std::string& device_uuid) {
  WC_ASSIGN_OR_RETURN(const DriverApi* api, Driver());
  WC_ASSIGN_OR_RETURN(CudaDevice dev, FindDevice(*api, device_uuid));
  return dev.ordinal;
}

}  // namespace internal

bool BuiltWithCuda() { return true; }

// CUDA_VERSION (cuda.h) is 1000 * major + 10 * minor, e.g. 11080.
std::string CudaVersionBuiltWith() {
  return absl::StrCat(CUDA_VERSION / 1000, ".", CUDA_VERSION % 1000 / 10);
}

absl::StatusOr<std::unique_ptr<Backend>> MakeCudaBackend(const CudaBackendOptions& options) {
  WC_ASSIGN_OR_RETURN(const internal::DriverApi* api, internal::Driver());
  WC_ASSIGN_OR_RETURN(auto devices, internal::ListDevices(*api));
  if (devices.empty()) {
    return absl::FailedPreconditionError(
        "backend cuda: no visible GPU supports virtual memory management with POSIX "
        "file-descriptor handles");
  }
  for (const auto& d : devices) {
    WC_LOG_INFO("cuda-vmm: %s ordinal %d %s sm_%d%d, %d MiB, granularity %d KiB", d.uuid, d.ordinal,
                d.name, d.cc_major, d.cc_minor, d.total_bytes >> 20, d.granularity >> 10);
  }
  return std::unique_ptr<Backend>(new internal::CudaBackend(*api, std::move(devices), options));
}

}  // namespace weightcache::memory
