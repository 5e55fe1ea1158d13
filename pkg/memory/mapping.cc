#include "pkg/memory/mapping.h"

#include <sys/mman.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "pkg/memory/internal/cuda_hooks.h"
#include "pkg/util/errno_status.h"

namespace weightcache::memory {
namespace {

// Host mappings: one PROT_READ, MAP_SHARED mmap per segment; the descriptors are closed
// once mapped (the mapping keeps the memfd alive).
class HostMapping final : public SegmentMapping {
 public:
  explicit HostMapping(bool writable) : writable_(writable) {}
  HostMapping(const HostMapping&) = delete;
  HostMapping& operator=(const HostMapping&) = delete;
  ~HostMapping() override {
    for (auto& [p, n] : maps_) ::munmap(p, n);
  }

  absl::Status Add(int fd, uint64_t size, size_t index) {
    void* p =
        ::mmap(nullptr, size, writable_ ? PROT_READ | PROT_WRITE : PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      return ErrnoStatus(errno, "mmap", absl::StrCat("segment ", index, " (", size, " bytes)"));
    }
    maps_.emplace_back(p, size);
    return absl::OkStatus();
  }

  const std::byte* base(size_t i) const override {
    return static_cast<const std::byte*>(maps_.at(i).first);
  }
  size_t count() const override { return maps_.size(); }
  BackendKind kind() const override { return BackendKind::kHost; }
  std::byte* writable_base(size_t i) const override {
    return writable_ ? static_cast<std::byte*>(maps_.at(i).first) : nullptr;
  }

  absl::Status Detach() override {
    if (writable_) {
      return absl::FailedPreconditionError("Detach: a publisher's writable mapping never detaches");
    }
    if (!attached_) return absl::OkStatus();
    for (size_t i = 0; i < maps_.size(); ++i) {
      if (auto s = Reserve(i); !s.ok()) return s;
    }
    attached_ = false;
    return absl::OkStatus();
  }

  absl::Status Reattach(std::vector<ScopedFd> fds, const std::vector<uint64_t>& sizes) override {
    if (attached_) return absl::FailedPreconditionError("Reattach: the mapping is attached");
    if (fds.size() != maps_.size() || sizes.size() != maps_.size()) {
      return absl::InvalidArgumentError(absl::StrCat("Reattach: ", fds.size(), " descriptors and ",
                                                     sizes.size(), " sizes for ", maps_.size(),
                                                     " detached segments"));
    }
    for (size_t i = 0; i < maps_.size(); ++i) {
      if (sizes[i] != maps_[i].second) {
        return absl::InvalidArgumentError(absl::StrCat("Reattach: segment ", i, " is ", sizes[i],
                                                       " bytes, the detached range ",
                                                       maps_[i].second));
      }
    }
    for (size_t i = 0; i < maps_.size(); ++i) {
      // MAP_FIXED replaces this process's own PROT_NONE reservation, and nothing else.
      void* p = ::mmap(maps_[i].first, maps_[i].second, PROT_READ, MAP_SHARED | MAP_FIXED,
                       fds[i].get(), 0);
      if (p == MAP_FAILED) {
        const int err = errno;
        for (size_t j = 0; j < i; ++j) (void)Reserve(j);  // detached again, as it was
        return ErrnoStatus(err, "mmap MAP_FIXED",
                           absl::StrCat("segment ", i, " (", maps_[i].second, " bytes)"));
      }
    }
    attached_ = true;
    return absl::OkStatus();
  }

  bool attached() const override { return attached_; }

 private:
  // Segment i's range as an inaccessible private reservation (the memfd's pages let go).
  absl::Status Reserve(size_t i) {
    void* p = ::mmap(maps_[i].first, maps_[i].second, PROT_NONE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
      return ErrnoStatus(errno, "mmap PROT_NONE",
                         absl::StrCat("reserving segment ", i, " (", maps_[i].second, " bytes)"));
    }
    return absl::OkStatus();
  }

  const bool writable_;
  bool attached_ = true;
  std::vector<std::pair<void*, size_t>> maps_;
};

absl::StatusOr<std::unique_ptr<SegmentMapping>> Map(BackendKind kind, std::vector<ScopedFd> fds,
                                                    const std::vector<uint64_t>& sizes,
                                                    const std::string& device_uuid, bool writable,
                                                    MapTimings* timings) {
  if (fds.size() != sizes.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(writable ? "MapWritable: " : "MapReadOnly: ", fds.size(), " descriptors for ",
                     sizes.size(), " segments"));
  }
  if (kind == BackendKind::kCudaVmm) {
    return writable ? internal::MapCudaWritable(std::move(fds), sizes, device_uuid)
                    : internal::MapCudaReadOnly(std::move(fds), sizes, device_uuid, timings);
  }
  const auto t0 = std::chrono::steady_clock::now();
  auto m = std::make_unique<HostMapping>(writable);
  for (size_t i = 0; i < fds.size(); ++i) {
    if (auto s = m->Add(fds[i].get(), sizes[i], i); !s.ok()) return s;
  }
  if (timings != nullptr) {
    *timings = {};
    timings->map_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  }
  return std::unique_ptr<SegmentMapping>(std::move(m));
}

}  // namespace

absl::StatusOr<std::unique_ptr<SegmentMapping>> MapReadOnly(BackendKind kind,
                                                            std::vector<ScopedFd> fds,
                                                            const std::vector<uint64_t>& sizes,
                                                            const std::string& device_uuid,
                                                            MapTimings* timings) {
  return Map(kind, std::move(fds), sizes, device_uuid, /*writable=*/false, timings);
}

absl::StatusOr<std::unique_ptr<SegmentMapping>> MapWritable(BackendKind kind,
                                                            std::vector<ScopedFd> fds,
                                                            const std::vector<uint64_t>& sizes,
                                                            const std::string& device_uuid) {
  return Map(kind, std::move(fds), sizes, device_uuid, /*writable=*/true, nullptr);
}

absl::Status CopyToHost(BackendKind kind, const std::string& device_uuid, const void* src, size_t n,
                        void* dst) {
  if (kind == BackendKind::kCudaVmm) return internal::CopyCudaToHost(device_uuid, src, n, dst);
  if (n != 0) std::memcpy(dst, src, n);
  return absl::OkStatus();
}

}  // namespace weightcache::memory
