// Host backend: each segment is a memfd, filled through a writable shared mapping while
// loading, then sealed (F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) and shared
// as a read-only descriptor, so a client can neither write nor mprotect its way to writing.
#include <fcntl.h>
#include <linux/memfd.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "pkg/memory/backend.h"
#include "pkg/util/errno_status.h"
#include "pkg/util/scoped_fd.h"

namespace weightcache::memory {
namespace {

constexpr uint64_t kHostGranularity = 2ull << 20;  // 2 MiB: matches the CUDA granularity

uint64_t RoundUp(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

class HostSegment final : public Segment {
 public:
  static absl::StatusOr<std::unique_ptr<HostSegment>> Create(uint64_t size,
                                                             const std::string& label) {
    ScopedFd fd(::memfd_create(label.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING));
    if (!fd) return ErrnoStatus(errno, "memfd_create", label);
    if (::ftruncate(fd.get(), static_cast<off_t>(size)) != 0) {
      return ErrnoStatus(errno, "ftruncate memfd", label);
    }
    void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
    if (p == MAP_FAILED) return ErrnoStatus(errno, "mmap memfd", label);
    return std::unique_ptr<HostSegment>(new HostSegment(std::move(fd), size, label,
                                                        static_cast<std::byte*>(p)));
  }

  ~HostSegment() override { Unmap(); }

  uint64_t size() const override { return size_; }
  std::byte* host_data() override { return sealed_ ? nullptr : data_; }

  absl::Status CopyIn(uint64_t offset, const void* src, size_t n) override {
    if (sealed_) return absl::FailedPreconditionError(absl::StrCat(label_, ": sealed"));
    if (offset > size_ || n > size_ - offset) {
      return absl::OutOfRangeError(absl::StrCat(label_, ": write [", offset, ", +", n,
                                                ") outside segment of ", size_, " bytes"));
    }
    std::memcpy(data_ + offset, src, n);
    return absl::OkStatus();
  }

  absl::Status Seal() override {
    if (sealed_) return absl::OkStatus();
    // A writable shared mapping blocks F_SEAL_WRITE (EBUSY): drop it first.
    Unmap();
    constexpr int kSeals = F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;
    if (::fcntl(fd_.get(), F_ADD_SEALS, kSeals) != 0) {
      return ErrnoStatus(errno, "F_ADD_SEALS", label_);
    }
    // A new open file description, read-only: what clients receive.
    std::string self = absl::StrCat("/proc/self/fd/", fd_.get());
    ScopedFd ro(::open(self.c_str(), O_RDONLY | O_CLOEXEC));
    if (!ro) return ErrnoStatus(errno, "reopen read-only", label_);
    ro_fd_ = std::move(ro);
    sealed_ = true;
    return absl::OkStatus();
  }

  bool sealed() const override { return sealed_; }
  int fd() const override { return sealed_ ? ro_fd_.get() : fd_.get(); }
  const std::string& device_uuid() const override { return device_; }

 private:
  HostSegment(ScopedFd fd, uint64_t size, std::string label, std::byte* data)
      : fd_(std::move(fd)), size_(size), label_(std::move(label)), data_(data) {}

  void Unmap() {
    if (data_ != nullptr) ::munmap(data_, size_);
    data_ = nullptr;
  }

  ScopedFd fd_;     // read-write: the daemon's own
  ScopedFd ro_fd_;  // read-only: shared with clients after Seal
  uint64_t size_;
  std::string label_;
  std::byte* data_;
  bool sealed_ = false;
  std::string device_ = "host";
};

class HostBackend final : public Backend {
 public:
  explicit HostBackend(const HostBackendOptions& o) : options_(o) {}

  BackendKind kind() const override { return BackendKind::kHost; }
  uint64_t granularity() const override { return kHostGranularity; }
  uint64_t max_segment_bytes() const override { return options_.max_segment_bytes; }

  std::vector<DeviceInfo> Devices() const override {
    DeviceInfo d;
    d.uuid = "host";
    d.name = "host";
    d.compute_capability = "cpu";
    long pages = ::sysconf(_SC_PHYS_PAGES);
    long avail = ::sysconf(_SC_AVPHYS_PAGES);
    long page = ::sysconf(_SC_PAGESIZE);
    d.total_bytes = pages > 0 ? static_cast<uint64_t>(pages) * page : 0;
    d.free_bytes = avail > 0 ? static_cast<uint64_t>(avail) * page : 0;
    return {d};
  }

  absl::StatusOr<std::unique_ptr<Segment>> Allocate(const std::string& device_uuid,
                                                    uint64_t size,
                                                    const std::string& label) override {
    if (!device_uuid.empty() && device_uuid != "host") {
      return absl::InvalidArgumentError(absl::StrCat(
          "host backend: device '", device_uuid, "' is not available (only 'host')"));
    }
    if (size == 0) return absl::InvalidArgumentError(absl::StrCat(label, ": empty segment"));
    auto seg = HostSegment::Create(RoundUp(size, kHostGranularity), label);
    if (!seg.ok()) return seg.status();
    return std::unique_ptr<Segment>(std::move(seg).value());
  }

 private:
  HostBackendOptions options_;
};

}  // namespace

const char* BackendName(BackendKind kind) {
  switch (kind) {
    case BackendKind::kHost:
      return "host";
    case BackendKind::kCudaVmm:
      return "cuda-vmm";
  }
  return "unknown";
}

std::unique_ptr<Backend> MakeHostBackend(const HostBackendOptions& options) {
  return std::make_unique<HostBackend>(options);
}

}  // namespace weightcache::memory
