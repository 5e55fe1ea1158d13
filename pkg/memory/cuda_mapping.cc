// Client side of cuda-vmm: maps the segment FDs of a lease into one reserved VA range,
// read-only, with a single cuMemSetAccess (it dominates mapping time; one call over the
// contiguous range is far cheaper than one per segment).
#include <chrono>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "pkg/memory/internal/cuda_driver.h"
#include "pkg/memory/internal/cuda_hooks.h"
#include "pkg/memory/internal/cuda_segment.h"
#include "pkg/util/status_macros.h"

namespace weightcache::memory::internal {
namespace {

double MsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

class CudaMapping final : public SegmentMapping {
 public:
  CudaMapping(const DriverApi& api, PrimaryContext ctx, bool writable)
      : api_(&api), ctx_(std::move(ctx)), writable_(writable) {}
  CudaMapping(const CudaMapping&) = delete;
  CudaMapping& operator=(const CudaMapping&) = delete;

  ~CudaMapping() override {
    // Order: unmap every segment, release the imported handles, free the VA reservation;
    // the primary-context reference goes last (member order).
    auto current = ScopedCurrentContext::Push(*api_, ctx_.get());
    // Work queued on any stream of the context ends before unmapping: a publisher's copies
    // land, and an engine's kernels still reading the weights never read an unmapped range
    // (issue 26). It waits for the context's other work too; releases are rare.
    if (current.ok()) (void)api_->cuCtxSynchronize();
    maps_.clear();
    handles_.clear();
    va_.reset();
  }

  const std::byte* base(size_t i) const override {
    return reinterpret_cast<const std::byte*>(static_cast<uintptr_t>(va_.get() + offsets_.at(i)));
  }
  size_t count() const override { return offsets_.size(); }
  BackendKind kind() const override { return BackendKind::kCudaVmm; }
  std::byte* writable_base(size_t i) const override {
    return writable_ ? const_cast<std::byte*>(base(i)) : nullptr;
  }

  // Imports `fds` and maps them at va_ + offsets_, with one cuMemSetAccess over the range.
  // The context must be current. On failure nothing of it stays mapped or imported.
  absl::Status ImportAndMap(std::vector<ScopedFd>& fds, MapTimings& t) {
    auto undo = [this](absl::Status s) {
      maps_.clear();
      handles_.clear();
      return s;
    };
    auto t0 = std::chrono::steady_clock::now();
    handles_.reserve(fds.size());
    for (size_t i = 0; i < fds.size(); ++i) {
      CUmemGenericAllocationHandle h = 0;
      CUresult r = api_->cuMemImportFromShareableHandle(
          &h, reinterpret_cast<void*>(static_cast<uintptr_t>(fds[i].get())),
          CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
      if (auto s = CuStatus(*api_, r, "cuMemImportFromShareableHandle",
                            absl::StrCat("segment ", i, ", fd ", fds[i].get()));
          !s.ok()) {
        return undo(s);
      }
      handles_.emplace_back(api_, h);
      fds[i].reset();  // the imported handle references the memory; the FD is no longer needed
    }
    t.import_ms = MsSince(t0);
    t0 = std::chrono::steady_clock::now();
    maps_.reserve(sizes_.size());
    for (size_t i = 0; i < sizes_.size(); ++i) {
      auto mapped = MappedRange::Map(*api_, va_.get() + offsets_[i], sizes_[i], handles_[i].get());
      if (!mapped.ok()) return undo(Annotate(mapped.status(), absl::StrCat("segment ", i)));
      maps_.push_back(std::move(mapped).value());
    }
    t.map_ms = MsSince(t0);
    t0 = std::chrono::steady_clock::now();
    if (auto s = SetAccess(
            *api_, va_.get(), total_, ordinal_,
            writable_ ? CU_MEM_ACCESS_FLAGS_PROT_READWRITE : CU_MEM_ACCESS_FLAGS_PROT_READ);
        !s.ok()) {
      return undo(s);
    }
    t.access_ms = MsSince(t0);
    return absl::OkStatus();
  }

  absl::Status Detach() override {
    if (writable_) {
      return absl::FailedPreconditionError("Detach: a publisher's writable mapping never detaches");
    }
    if (maps_.empty()) return absl::OkStatus();
    WC_ASSIGN_OR_RETURN(auto current, ScopedCurrentContext::Push(*api_, ctx_.get()));
    // Kernels still reading the weights end first (as on destruction); then cuMemUnmap and
    // cuMemRelease: the VA reservation (cuMemAddressReserve) stays, so nothing else is ever
    // mapped at these addresses.
    WC_RETURN_IF_ERROR(
        CuStatus(*api_, api_->cuCtxSynchronize(), "cuCtxSynchronize", "before detaching"));
    maps_.clear();
    handles_.clear();
    return absl::OkStatus();
  }

  absl::Status Reattach(std::vector<ScopedFd> fds, const std::vector<uint64_t>& sizes) override {
    if (!maps_.empty()) return absl::FailedPreconditionError("Reattach: the mapping is attached");
    if (fds.size() != sizes_.size() || sizes.size() != sizes_.size()) {
      return absl::InvalidArgumentError(absl::StrCat("Reattach: ", fds.size(), " descriptors and ",
                                                     sizes.size(), " sizes for ", sizes_.size(),
                                                     " detached segments"));
    }
    for (size_t i = 0; i < sizes_.size(); ++i) {
      if (sizes[i] != sizes_[i]) {
        return absl::InvalidArgumentError(absl::StrCat("Reattach: segment ", i, " is ", sizes[i],
                                                       " bytes, the detached range ", sizes_[i]));
      }
    }
    WC_ASSIGN_OR_RETURN(auto current, ScopedCurrentContext::Push(*api_, ctx_.get()));
    MapTimings t;
    return ImportAndMap(fds, t);
  }

  bool attached() const override { return !maps_.empty(); }

  const DriverApi* api_;
  PrimaryContext ctx_;
  const bool writable_;
  int ordinal_ = -1;
  uint64_t total_ = 0;
  VaReservation va_;
  std::vector<AllocationHandle> handles_;
  std::vector<MappedRange> maps_;
  std::vector<uint64_t> offsets_;
  std::vector<uint64_t> sizes_;
};

absl::StatusOr<std::unique_ptr<SegmentMapping>> MapCuda(std::vector<ScopedFd> fds,
                                                        const std::vector<uint64_t>& sizes,
                                                        const std::string& device_uuid,
                                                        MapTimings* timings, bool writable) {
  MapTimings t;
  if (fds.size() != sizes.size()) {
    return absl::InvalidArgumentError(absl::StrCat("MapCudaReadOnly: ", fds.size(),
                                                   " descriptors for ", sizes.size(), " segments"));
  }
  if (fds.empty()) return absl::InvalidArgumentError("MapCudaReadOnly: no segments");
  auto t0 = std::chrono::steady_clock::now();
  WC_ASSIGN_OR_RETURN(const DriverApi* api, Driver());
  WC_ASSIGN_OR_RETURN(CudaDevice dev, FindDevice(*api, device_uuid));
  WC_ASSIGN_OR_RETURN(auto ctx, PrimaryContext::Retain(*api, dev.device));
  WC_ASSIGN_OR_RETURN(auto current, ScopedCurrentContext::Push(*api, ctx.get()));
  auto m = std::make_unique<CudaMapping>(*api, std::move(ctx), writable);
  t.context_ms = MsSince(t0);

  m->ordinal_ = dev.ordinal;
  m->offsets_.reserve(sizes.size());
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] == 0 || sizes[i] % dev.granularity != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("MapCudaReadOnly: segment ", i, " size ", sizes[i],
                       " is not a positive multiple of the granularity ", dev.granularity));
    }
    m->offsets_.push_back(m->total_);
    m->total_ += sizes[i];
  }
  m->sizes_ = sizes;

  t0 = std::chrono::steady_clock::now();
  WC_ASSIGN_OR_RETURN(m->va_, VaReservation::Reserve(*api, m->total_, dev.granularity));
  t.reserve_ms = MsSince(t0);
  WC_RETURN_IF_ERROR(m->ImportAndMap(fds, t));
  if (timings != nullptr) *timings = t;
  return std::unique_ptr<SegmentMapping>(std::move(m));
}

}  // namespace

absl::StatusOr<std::unique_ptr<SegmentMapping>> MapCudaReadOnly(std::vector<ScopedFd> fds,
                                                                const std::vector<uint64_t>& sizes,
                                                                const std::string& device_uuid,
                                                                MapTimings* timings) {
  return MapCuda(std::move(fds), sizes, device_uuid, timings, /*writable=*/false);
}

absl::StatusOr<std::unique_ptr<SegmentMapping>> MapCudaWritable(std::vector<ScopedFd> fds,
                                                                const std::vector<uint64_t>& sizes,
                                                                const std::string& device_uuid) {
  return MapCuda(std::move(fds), sizes, device_uuid, nullptr, /*writable=*/true);
}

absl::Status CopyCudaToHost(const std::string& device_uuid, const void* src, size_t n, void* dst) {
  if (n == 0) return absl::OkStatus();
  WC_ASSIGN_OR_RETURN(const DriverApi* api, Driver());
  WC_ASSIGN_OR_RETURN(CudaDevice dev, FindDevice(*api, device_uuid));
  WC_ASSIGN_OR_RETURN(auto ctx, PrimaryContext::Retain(*api, dev.device));
  WC_ASSIGN_OR_RETURN(auto current, ScopedCurrentContext::Push(*api, ctx.get()));
  return CuStatus(
      *api, api->cuMemcpyDtoH(dst, static_cast<CUdeviceptr>(reinterpret_cast<uintptr_t>(src)), n),
      "cuMemcpyDtoH", absl::StrCat(n, " bytes from ", device_uuid));
}

}  // namespace weightcache::memory::internal
