// Memory backends: where a model-rank's weights live while the daemon serves them.
// One interface, chosen at run time:
//   - host:     memfd_create segments, sealed after loading; clients mmap them PROT_READ.
//   - cuda-vmm: cuMemCreate allocations exported as POSIX file descriptors; clients import,
//               map into one reserved VA range and set read-only access.
// Both hand out real file descriptors, so the protocol path is the same for both.
//
// Lifetimes: a Segment owns its memory and its shareable FD; the registry owns Segments.
// Dropping a Segment drops only the daemon's reference: memory a client still maps stays
// valid (the kernel / the driver count references).
// Thread-safety: Backend methods may be called from any thread. A Segment is filled by the
// loader (concurrent CopyIn/host_data writes to disjoint ranges are allowed), then Seal()ed
// once; after Seal it is immutable and safe to share.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "pkg/util/scoped_fd.h"

namespace weightcache::memory {

enum class BackendKind { kHost, kCudaVmm };

// "host" | "cuda-vmm"
const char* BackendName(BackendKind kind);

// How Backend::CopySegment moves bytes between two devices of one backend.
enum class CopyRoute {
  kPeer,        // device to device (CUDA: the destination GPU reads the source over
                // NVLink/PCIe P2P); needs CanAccessPeer(src, dst)
  kHostStaged,  // through pinned host memory (device -> host -> device); always possible
};
// "peer" | "host"
const char* CopyRouteName(CopyRoute route);

// Backend::CopySegment's cancellation point and progress report: called on the copying
// thread before each chunk with the bytes copied so far (0 first); returning false stops the
// copy there (CANCELLED). Empty: the copy runs to the end. A chunk is at most
// kCopyChunkBytes, so a cancelled copy ends within one chunk's time.
using CopyTick = std::function<bool(uint64_t copied)>;
inline constexpr uint64_t kCopyChunkBytes = 32ull << 20;

struct DeviceInfo {
  std::string uuid;                // "GPU-..." for CUDA; "host" for the host backend
  int ordinal = -1;                // CUDA ordinal in this process; -1 for host
  std::string name;                // "NVIDIA H200" / "host"
  std::string compute_capability;  // "sm_90" / "cpu"
  uint64_t total_bytes = 0;
  uint64_t free_bytes = 0;
};

class Segment {
 public:
  virtual ~Segment() = default;

  // Mappable size in bytes (a multiple of the backend's granularity).
  virtual uint64_t size() const = 0;
  // Writable host pointer while unsealed when the memory is host-addressable (host
  // backend), else null: then use CopyIn.
  virtual std::byte* host_data() = 0;
  // Copies `n` bytes of host memory into the segment at `offset` (before Seal).
  virtual absl::Status CopyIn(uint64_t offset, const void* src, size_t n) = 0;
  // Makes the memory immutable. After Seal, fd() may be shared with clients.
  virtual absl::Status Seal() = 0;
  virtual bool sealed() const = 0;
  // The shareable descriptor. The Segment keeps owning it; senders dup() it.
  // For the host backend this is a read-only descriptor of the sealed memfd.
  virtual int fd() const = 0;
  // Device that holds the memory ("host" for the host backend).
  virtual const std::string& device_uuid() const = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;

  virtual BackendKind kind() const = 0;
  // Segment sizes are multiples of this.
  virtual uint64_t granularity() const = 0;
  // Tensors inside a segment start at multiples of this.
  virtual uint64_t tensor_alignment() const { return 256; }
  // Preferred upper bound of one segment; larger tensors get a segment of their own.
  virtual uint64_t max_segment_bytes() const = 0;
  // Devices memory can be placed on, queried now (free bytes are current).
  virtual std::vector<DeviceInfo> Devices() const = 0;
  // Allocates a segment of at least `size` bytes on `device_uuid` (empty: the first
  // device). `label` names it for the kernel/driver (e.g. memfd name) and in errors.
  // Every byte of the new segment reads as zero until written (cuda-vmm: one memset at
  // allocation, since cuMemCreate promises nothing; host: a new memfd is zero-filled), so
  // the bytes no tensor covers, which the digests hash and engines may read, are the
  // daemon's zeros, never an earlier owner's data.
  virtual absl::StatusOr<std::unique_ptr<Segment>> Allocate(const std::string& device_uuid,
                                                            uint64_t size,
                                                            const std::string& label) = 0;

  // Adoption (a restarted daemon re-serving what the keeper held for its predecessor): a
  // sealed segment around `fd`, a descriptor an earlier daemon exported from this backend
  // for `size` bytes on `device_uuid`. The segment owns `fd` and shares it with clients as
  // fd(). INVALID_ARGUMENT naming `label` and what does not fit when the descriptor is not
  // one this backend can serve (host: not a sealed, read-only memfd of `size` bytes;
  // cuda-vmm: the driver refuses to import it) or the device is unknown.
  // This default (backends that cannot adopt): UNIMPLEMENTED.
  virtual absl::StatusOr<std::unique_ptr<Segment>> Adopt(const std::string& device_uuid,
                                                         ScopedFd fd, uint64_t size,
                                                         const std::string& label) {
    (void)device_uuid, (void)fd, (void)size, (void)label;
    return absl::UnimplementedError("this memory backend cannot adopt segments");
  }

  // Whether device `dst_uuid` can read memory of device `src_uuid` directly (CUDA:
  // cuDeviceCanAccessPeer; the same device: true). False for unknown devices.
  // This default: only the same device.
  virtual bool CanAccessPeer(const std::string& src_uuid, const std::string& dst_uuid) const {
    return src_uuid == dst_uuid;
  }
  // Bytes of segments on `device_uuid` that this backend dropped (their Segment destroyed)
  // and that another process still holds: descriptors or mappings an engine kept after its
  // lease ended. The budget counts them until they are really gone (issue 25).
  // This default (cuda-vmm: the driver does not say when an exported allocation's last
  // importer lets go): 0.
  virtual uint64_t LingeringBytes(const std::string& device_uuid) {
    (void)device_uuid;
    return 0;
  }
  // Copies the first src.size() bytes of `src` (sealed or not, on any device of this
  // backend) into `dst` (unsealed, at least as large, usually on another device) at offset
  // 0, synchronously: when it returns OK the bytes are in `dst` (still to be Seal()ed).
  // kPeer when !CanAccessPeer: FAILED_PRECONDITION naming both devices. Both segments
  // must come from this backend (INVALID_ARGUMENT otherwise). Any thread; `src` may be
  // read by other copies at the same time. `tick` (may be empty): see CopyTick; when it
  // stops the copy, CANCELLED and `dst` holds a prefix of the bytes.
  // This default (backends that cannot copy between devices): UNIMPLEMENTED.
  virtual absl::Status CopySegment(Segment& src, Segment* dst, CopyRoute route,
                                   const CopyTick& tick) {
    (void)src, (void)dst, (void)route, (void)tick;
    return absl::UnimplementedError("this memory backend cannot copy between devices");
  }
};

// The host (memfd) backend; always available.
struct HostBackendOptions {
  uint64_t max_segment_bytes = 1ull << 30;
  // The "devices" segments are placed on. Production: {"host"}. Tests (and CPU-only
  // rehearsals of multi-GPU placement, `weightcached --host_devices`) name several fake
  // devices: each is a label on real memfd segments, so keying, placement and the
  // peer-copy policy run on real FDs without a GPU.
  std::vector<std::string> device_uuids = {"host"};
  // What CanAccessPeer answers between two different fake devices (false models a node
  // whose GPUs cannot reach each other, so kPeer copies are refused).
  bool peer_access = true;
};
std::unique_ptr<Backend> MakeHostBackend(const HostBackendOptions& options = {});

}  // namespace weightcache::memory
