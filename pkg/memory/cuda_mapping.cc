// Client side of cuda-vmm: maps the segment FDs of a lease into one reserved VA range,
// read-only, with a single cuMemSetAccess (it dominates mapping time; one call over the
// contiguous range is far cheaper than one per segment).
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "pkg/memory/internal/cuda_driver.h"
#include "pkg/memory/internal/cuda_hooks.h"
#include "pkg/memory/internal/cuda_segment.h"
#include "pkg/util/status_macros.h"

namespace weightcache::memory::internal {
namespace {

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
    // A publisher's writes (copies queued on any stream of the context) land before unmapping.
    if (writable_ && current.ok()) (void)api_->cuCtxSynchronize();
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

  const DriverApi* api_;
  PrimaryContext ctx_;
  const bool writable_;
  VaReservation va_;
  std::vector<AllocationHandle> handles_;
  std::vector<MappedRange> maps_;
  std::vector<uint64_t> offsets_;
};

// Threads that set access over a lease's range: WEIGHTCACHE_MAP_THREADS (1..64), else 1.
size_t MapThreads() {
  if (const char* e = std::getenv("WEIGHTCACHE_MAP_THREADS"); e != nullptr && *e != '\0') {
    const long v = std::strtol(e, nullptr, 10);
    if (v >= 1 && v <= 64) return static_cast<size_t>(v);
  }
  return 1;
}

double MsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

absl::StatusOr<std::unique_ptr<SegmentMapping>> MapCuda(std::vector<ScopedFd> fds,
                                                        const std::vector<uint64_t>& sizes,
                                                        const std::string& device_uuid,
                                                        CudaMapTimings* timings, bool writable) {
  CudaMapTimings t;
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

  uint64_t total = 0;
  m->offsets_.reserve(sizes.size());
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] == 0 || sizes[i] % dev.granularity != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("MapCudaReadOnly: segment ", i, " size ", sizes[i],
                       " is not a positive multiple of the granularity ", dev.granularity));
    }
    m->offsets_.push_back(total);
    total += sizes[i];
  }

  t0 = std::chrono::steady_clock::now();
  WC_ASSIGN_OR_RETURN(m->va_, VaReservation::Reserve(*api, total, dev.granularity));
  t.reserve_ms = MsSince(t0);

  // Import and map every segment on this thread (the driver serializes imports: spread over
  // threads they took 5x as long on the H200), then set access: cuMemSetAccess costs time in
  // proportion to the bytes (page-table entries), so WEIGHTCACHE_MAP_THREADS > 1 splits it
  // into that many calls over contiguous ranges, one per thread (docs/benchmarks.md).
  const size_t n = fds.size();
  m->handles_.reserve(n);
  t0 = std::chrono::steady_clock::now();
  for (size_t i = 0; i < n; ++i) {
    CUmemGenericAllocationHandle h = 0;
    CUresult r = api->cuMemImportFromShareableHandle(
        &h, reinterpret_cast<void*>(static_cast<uintptr_t>(fds[i].get())),
        CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    WC_RETURN_IF_ERROR(CuStatus(*api, r, "cuMemImportFromShareableHandle",
                                absl::StrCat("segment ", i, ", fd ", fds[i].get())));
    m->handles_.emplace_back(api, h);
    fds[i].reset();  // the imported handle references the memory; the FD is no longer needed
  }
  t.import_ms = MsSince(t0);

  t0 = std::chrono::steady_clock::now();
  m->maps_.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    auto mapped =
        MappedRange::Map(*api, m->va_.get() + m->offsets_[i], sizes[i], m->handles_[i].get());
    if (!mapped.ok()) return Annotate(mapped.status(), absl::StrCat("segment ", i));
    m->maps_.push_back(std::move(mapped).value());
  }
  t.map_ms = MsSince(t0);

  t0 = std::chrono::steady_clock::now();
  const CUmemAccess_flags flags =
      writable ? CU_MEM_ACCESS_FLAGS_PROT_READWRITE : CU_MEM_ACCESS_FLAGS_PROT_READ;
  const size_t groups = std::max<size_t>(1, std::min<size_t>(MapThreads(), n));
  if (groups == 1) {
    WC_RETURN_IF_ERROR(SetAccess(*api, m->va_.get(), total, dev.ordinal, flags));
  } else {
    // Contiguous runs of whole segments of about total / groups bytes each.
    std::vector<size_t> first{0};
    uint64_t at = 0;
    for (size_t i = 0; i < n; ++i) {
      if (at >= total / groups * first.size() && first.back() != i) first.push_back(i);
      at += sizes[i];
    }
    first.push_back(n);
    std::vector<absl::Status> status(first.size() - 1);
    auto work = [&](size_t g) {
      auto pushed = ScopedCurrentContext::Push(*api, m->ctx_.get());
      if (!pushed.ok()) {
        status[g] = pushed.status();
        return;
      }
      const uint64_t begin = m->offsets_[first[g]];
      const uint64_t end = first[g + 1] < n ? m->offsets_[first[g + 1]] : total;
      status[g] = SetAccess(*api, m->va_.get() + begin, end - begin, dev.ordinal, flags);
    };
    std::vector<std::thread> threads;
    for (size_t g = 1; g < status.size(); ++g) threads.emplace_back(work, g);
    work(0);
    for (auto& th : threads) th.join();
    for (auto& st : status) WC_RETURN_IF_ERROR(st);
  }
  t.access_ms = MsSince(t0);
  if (timings != nullptr) *timings = t;
  return std::unique_ptr<SegmentMapping>(std::move(m));
}

}  // namespace

absl::StatusOr<std::unique_ptr<SegmentMapping>> MapCudaReadOnlyTimed(
    std::vector<ScopedFd> fds, const std::vector<uint64_t>& sizes, const std::string& device_uuid,
    CudaMapTimings* timings) {
  return MapCuda(std::move(fds), sizes, device_uuid, timings, /*writable=*/false);
}

absl::StatusOr<std::unique_ptr<SegmentMapping>> MapCudaWritable(std::vector<ScopedFd> fds,
                                                                const std::vector<uint64_t>& sizes,
                                                                const std::string& device_uuid) {
  return MapCuda(std::move(fds), sizes, device_uuid, nullptr, /*writable=*/true);
}

absl::StatusOr<std::unique_ptr<SegmentMapping>> MapCudaReadOnly(std::vector<ScopedFd> fds,
                                                                const std::vector<uint64_t>& sizes,
                                                                const std::string& device_uuid) {
  return MapCudaReadOnlyTimed(std::move(fds), sizes, device_uuid, nullptr);
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
