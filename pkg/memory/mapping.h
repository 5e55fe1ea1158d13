// Client side of a memory backend: maps the segment FDs of a lease read-only into this
// process. Move-only owner of every mapping it made; unmaps (and for CUDA, unmaps, frees
// the VA reservation and releases the imported handles, in that order) on destruction.
// Thread-safety: immutable after Map, except Detach/Reattach (below), which the owner calls
// while no other thread uses the mapping; addresses stay the same as long as the object lives.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "pkg/memory/backend.h"
#include "pkg/util/scoped_fd.h"

namespace weightcache::memory {

class SegmentMapping {
 public:
  virtual ~SegmentMapping() = default;
  // Base address of segment i (host pointer for host, device pointer for CUDA).
  virtual const std::byte* base(size_t i) const = 0;
  virtual size_t count() const = 0;
  virtual BackendKind kind() const = 0;
  // The same address, writable: only for a mapping made by MapWritable; null otherwise.
  virtual std::byte* writable_base(size_t i) const {
    (void)i;
    return nullptr;
  }

  // Sleep and wake (a read-only mapping only; FAILED_PRECONDITION for a writable one).
  // Detach unmaps every segment and lets go of the memory (host: the memfd mappings are
  // replaced, MAP_FIXED, by PROT_NONE anonymous reservations; cuda-vmm: cuCtxSynchronize,
  // cuMemUnmap of every segment, cuMemRelease of the imported handles), keeping the address
  // ranges reserved (host: the PROT_NONE ranges; cuda-vmm: the cuMemAddressReserve range), so
  // nothing else can be mapped there and base(i) keeps its value. Reading a detached range
  // faults (SIGSEGV on the host, an illegal address on the GPU). Detaching twice is a no-op.
  virtual absl::Status Detach() { return absl::UnimplementedError("this mapping cannot detach"); }
  // Maps `fds[i]` (size `sizes[i]`) at the very addresses detached, read-only (host: MAP_FIXED
  // into the reservation; cuda-vmm: import, cuMemMap at the reserved VA, cuMemSetAccess).
  // Takes the FDs. The sizes must equal those mapped first (INVALID_ARGUMENT naming the
  // segment otherwise). On failure the mapping stays detached (what was mapped is reserved
  // again). FAILED_PRECONDITION when attached.
  // By value: an override takes the descriptors over (this default has no use for them).
  virtual absl::Status Reattach(
      std::vector<ScopedFd> /*fds*/,  // NOLINT(performance-unnecessary-value-param)
      const std::vector<uint64_t>& /*sizes*/) {
    return absl::UnimplementedError("this mapping cannot re-attach");
  }
  virtual bool attached() const { return true; }
};

// Where the time of MapReadOnly goes (cuda-vmm; the host backend fills map_ms only).
struct MapTimings {
  double context_ms = 0;  // device lookup + primary-context retain
  double import_ms = 0;   // cuMemImportFromShareableHandle for every FD
  double reserve_ms = 0;  // one cuMemAddressReserve
  double map_ms = 0;      // cuMemMap of every segment (host: every mmap)
  double access_ms = 0;   // one cuMemSetAccess (read-only) over the whole range
};

// Maps `fds[i]` (size `sizes[i]`) read-only. For cuda-vmm, `device_uuid` names the GPU to
// map on (must be visible to this process). Takes ownership of the FDs (host: closed
// after mmap; CUDA: closed after import). `timings` (optional) receives the stages.
absl::StatusOr<std::unique_ptr<SegmentMapping>> MapReadOnly(BackendKind kind,
                                                            std::vector<ScopedFd> fds,
                                                            const std::vector<uint64_t>& sizes,
                                                            const std::string& device_uuid,
                                                            MapTimings* timings = nullptr);

// Maps `fds[i]` read-write: only for a publisher's segments (the daemon hands writable
// descriptors out for a publish only). Destroying the mapping waits for writes queued into
// it (cuda-vmm: cuCtxSynchronize in the device's primary context), then unmaps: a host memfd
// can be sealed only once no writable mapping of it remains.
absl::StatusOr<std::unique_ptr<SegmentMapping>> MapWritable(BackendKind kind,
                                                            std::vector<ScopedFd> fds,
                                                            const std::vector<uint64_t>& sizes,
                                                            const std::string& device_uuid);

// Copies `n` bytes of a mapping made by MapReadOnly (`src`, from base(i) + offset) into the
// host buffer `dst`, synchronously: memcpy for host mappings; for cuda-vmm, cuMemcpyDtoH in
// the primary context of `device_uuid` (the mapping's device). Lets tools such as
// `weightcachectl verify` compare device memory with a checkpoint. UNIMPLEMENTED for
// cuda-vmm in a build without CUDA. Any thread.
absl::Status CopyToHost(BackendKind kind, const std::string& device_uuid, const void* src, size_t n,
                        void* dst);

}  // namespace weightcache::memory
