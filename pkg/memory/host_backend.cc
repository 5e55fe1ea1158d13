// Host backend: each segment is a memfd, filled through a writable shared mapping while
// loading, then sealed (F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) and shared
// as a read-only descriptor, so a client can neither write nor mprotect its way to writing.
#include <fcntl.h>
#include <linux/memfd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "pkg/memory/backend.h"
#include "pkg/memory/internal/release_watch.h"
#include "pkg/util/bytes.h"
#include "pkg/util/errno_status.h"
#include "pkg/util/scoped_fd.h"

namespace weightcache::memory {
namespace {

constexpr uint64_t kHostGranularity = 2ull << 20;  // 2 MiB: matches the CUDA granularity

class HostSegment final : public Segment {
 public:
  static absl::StatusOr<std::unique_ptr<HostSegment>> Create(uint64_t size,
                                                             const std::string& label,
                                                             const std::string& device,
                                                             std::shared_ptr<ReleaseWatch> watch) {
    ScopedFd fd(::memfd_create(label.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING));
    if (!fd) return ErrnoStatus(errno, "memfd_create", label);
    if (::ftruncate(fd.get(), static_cast<off_t>(size)) != 0) {
      return ErrnoStatus(errno, "ftruncate memfd", label);
    }
    void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
    if (p == MAP_FAILED) return ErrnoStatus(errno, "mmap memfd", label);
    return std::unique_ptr<HostSegment>(new HostSegment(
        std::move(fd), size, label, device, static_cast<std::byte*>(p), std::move(watch)));
  }

  // A sealed memfd an earlier daemon created (Backend::Adopt): `fd` is its read-only
  // descriptor, checked to be what Seal() leaves.
  static absl::StatusOr<std::unique_ptr<HostSegment>> Adopt(ScopedFd fd, uint64_t size,
                                                            const std::string& label,
                                                            const std::string& device,
                                                            std::shared_ptr<ReleaseWatch> watch) {
    struct stat st {};
    if (::fstat(fd.get(), &st) != 0) return ErrnoStatus(errno, "fstat adopted segment", label);
    if (static_cast<uint64_t>(st.st_size) != size) {
      return absl::InvalidArgumentError(absl::StrCat(label, ": adopted descriptor holds ",
                                                     st.st_size, " bytes, its record says ", size));
    }
    constexpr int kSeals = F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW;
    const int seals = ::fcntl(fd.get(), F_GET_SEALS);
    if (seals < 0 || (seals & kSeals) != kSeals) {
      return absl::InvalidArgumentError(
          absl::StrCat(label, ": adopted descriptor is not a sealed memfd (seals ", seals, ")"));
    }
    if ((::fcntl(fd.get(), F_GETFL) & O_ACCMODE) != O_RDONLY) {
      return absl::InvalidArgumentError(
          absl::StrCat(label, ": adopted descriptor is writable; a sealed segment's is read-only"));
    }
    auto seg = std::unique_ptr<HostSegment>(
        new HostSegment(ScopedFd(), size, label, device, nullptr, std::move(watch)));
    seg->ro_fd_ = std::move(fd);
    seg->sealed_ = true;
    return seg;
  }

  ~HostSegment() override {
    Unmap();
    // Whoever else holds the memfd (an engine, the keeper) keeps the memory: counted
    // against the budget until the last of them lets go.
    if (watch_) watch_->Track(fd(), device_, size_, label_);
  }

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
  HostSegment(ScopedFd fd, uint64_t size, std::string label, std::string device, std::byte* data,
              std::shared_ptr<ReleaseWatch> watch)
      : fd_(std::move(fd)),
        size_(size),
        label_(std::move(label)),
        data_(data),
        device_(std::move(device)),
        watch_(std::move(watch)) {}

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
  std::string device_;
  std::shared_ptr<ReleaseWatch> watch_;
};

class HostBackend final : public Backend {
 public:
  explicit HostBackend(const HostBackendOptions& o)
      : options_(o), watch_(std::make_shared<ReleaseWatch>()) {}

  BackendKind kind() const override { return BackendKind::kHost; }
  uint64_t granularity() const override { return kHostGranularity; }
  uint64_t max_segment_bytes() const override { return options_.max_segment_bytes; }

  std::vector<DeviceInfo> Devices() const override {
    long pages = ::sysconf(_SC_PHYS_PAGES);
    long avail = ::sysconf(_SC_AVPHYS_PAGES);
    long page = ::sysconf(_SC_PAGESIZE);
    std::vector<DeviceInfo> out;
    for (const auto& uuid : options_.device_uuids) {
      DeviceInfo d;
      d.uuid = uuid;
      d.name = "host";
      d.compute_capability = "cpu";
      d.total_bytes = pages > 0 ? static_cast<uint64_t>(pages) * page : 0;
      d.free_bytes = avail > 0 ? static_cast<uint64_t>(avail) * page : 0;
      out.push_back(std::move(d));
    }
    return out;
  }

  absl::StatusOr<std::unique_ptr<Segment>> Allocate(const std::string& device_uuid, uint64_t size,
                                                    const std::string& label) override {
    const std::string device = device_uuid.empty() ? options_.device_uuids.front() : device_uuid;
    if (!Known(device)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "host backend: device '", device_uuid,
          "' is not available (devices: ", absl::StrJoin(options_.device_uuids, ", "), ")"));
    }
    if (size == 0) return absl::InvalidArgumentError(absl::StrCat(label, ": empty segment"));
    auto seg = HostSegment::Create(RoundUp(size, kHostGranularity), label, device, watch_);
    if (!seg.ok()) return seg.status();
    return std::unique_ptr<Segment>(std::move(seg).value());
  }

  absl::StatusOr<std::unique_ptr<Segment>> Adopt(const std::string& device_uuid, ScopedFd fd,
                                                 uint64_t size, const std::string& label) override {
    if (!Known(device_uuid)) {
      return absl::InvalidArgumentError(absl::StrCat(
          label, ": adopted on device '", device_uuid, "', which this host backend does not have (",
          absl::StrJoin(options_.device_uuids, ", "), ")"));
    }
    auto seg = HostSegment::Adopt(std::move(fd), size, label, device_uuid, watch_);
    if (!seg.ok()) return seg.status();
    return std::unique_ptr<Segment>(std::move(seg).value());
  }

  bool CanAccessPeer(const std::string& src_uuid, const std::string& dst_uuid) const override {
    if (!Known(src_uuid) || !Known(dst_uuid)) return false;
    return src_uuid == dst_uuid || options_.peer_access;
  }

  // The host analogue of a GPU peer copy: the source memfd mapped read-only, copied into
  // the destination's writable mapping (kHostStaged through a bounce buffer, like the
  // pinned staging buffer of the CUDA path).
  absl::Status CopySegment(Segment& src, Segment* dst, CopyRoute route,
                           const CopyTick& tick) override {
    auto* d = dynamic_cast<HostSegment*>(dst);
    if (dynamic_cast<HostSegment*>(&src) == nullptr || d == nullptr) {
      return absl::InvalidArgumentError("host backend: CopySegment of a foreign segment");
    }
    if (d->host_data() == nullptr) {
      return absl::FailedPreconditionError("host backend: CopySegment into a sealed segment");
    }
    if (d->size() < src.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("host backend: CopySegment of ", src.size(), " bytes into ", d->size()));
    }
    if (route == CopyRoute::kPeer && !CanAccessPeer(src.device_uuid(), d->device_uuid())) {
      return absl::FailedPreconditionError(absl::StrCat(
          "host backend: no peer access from ", d->device_uuid(), " to ", src.device_uuid()));
    }
    void* p = ::mmap(nullptr, src.size(), PROT_READ, MAP_SHARED, src.fd(), 0);
    if (p == MAP_FAILED) return ErrnoStatus(errno, "mmap source memfd", src.device_uuid());
    const auto* from = static_cast<const std::byte*>(p);
    // Chunk by chunk, so that a cancellation (daemon shutdown) ends the copy within one
    // chunk: a 512 MiB segment is over a second of page faults on a busy machine.
    std::vector<std::byte> bounce;
    if (route == CopyRoute::kHostStaged) bounce.resize(std::min<uint64_t>(src.size(), 4ull << 20));
    absl::Status st = absl::OkStatus();
    for (uint64_t off = 0; off < src.size(); off += kCopyChunkBytes) {
      if (tick && !tick(off)) {
        st = absl::CancelledError(absl::StrCat("host backend: copy to ", d->device_uuid(),
                                               " stopped after ", off, " of ", src.size(),
                                               " bytes"));
        break;
      }
      const uint64_t end = std::min<uint64_t>(src.size(), off + kCopyChunkBytes);
      if (route == CopyRoute::kPeer) {
        std::memcpy(d->host_data() + off, from + off, end - off);
        continue;
      }
      for (uint64_t at = off; at < end; at += bounce.size()) {
        const uint64_t n = std::min<uint64_t>(bounce.size(), end - at);
        std::memcpy(bounce.data(), from + at, n);
        std::memcpy(d->host_data() + at, bounce.data(), n);
      }
    }
    ::munmap(p, src.size());
    return st;
  }

 private:
  bool Known(const std::string& uuid) const {
    return std::find(options_.device_uuids.begin(), options_.device_uuids.end(), uuid) !=
           options_.device_uuids.end();
  }

  uint64_t LingeringBytes(const std::string& device_uuid) override {
    return watch_->Lingering(device_uuid);
  }

  HostBackendOptions options_;
  std::shared_ptr<ReleaseWatch> watch_;
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

const char* CopyRouteName(CopyRoute route) { return route == CopyRoute::kPeer ? "peer" : "host"; }

std::unique_ptr<Backend> MakeHostBackend(const HostBackendOptions& options) {
  HostBackendOptions o = options;
  if (o.device_uuids.empty()) o.device_uuids = {"host"};
  return std::make_unique<HostBackend>(o);
}

}  // namespace weightcache::memory
