#include "pkg/integrity/internal/digest_cuda.h"

namespace weightcache::integrity::internal {

absl::StatusOr<SegmentDigest> DigestDevice(const std::string& device_uuid,
                                           const std::byte* /*device_ptr*/, uint64_t /*size*/,
                                           const Pacer& /*pacer*/, const ScrubKey& /*key*/,
                                           bool /*crypto*/) {
  return absl::UnimplementedError("digest of memory on " + device_uuid +
                                  ": this build has no CUDA");
}

}  // namespace weightcache::integrity::internal
