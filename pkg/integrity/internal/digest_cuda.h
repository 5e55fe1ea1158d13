// The GPU side of DigestSegment (digest_cuda.cu; digest_cuda_absent.cc in builds without
// CUDA: UNIMPLEMENTED). Free of CUDA headers. Private to pkg/integrity and its GPU test.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "pkg/integrity/digest.h"
#include "pkg/integrity/internal/pacer.h"

namespace weightcache::integrity::internal {

// The digest of `size` bytes of device memory at `device_ptr` (mapped in this process on
// GPU `device_uuid`), computed by a kernel on a lowest-priority non-blocking stream in that
// device's primary context, one kPieceBytes piece at a time (`pacer` between pieces), under
// `key` (copied to the device once per process and device); with `crypto`, the
// cryptographic digest too (crypto_digest.h's tree, its leaves and chunks on the GPU).
absl::StatusOr<SegmentDigest> DigestDevice(const std::string& device_uuid,
                                           const std::byte* device_ptr, uint64_t size,
                                           const Pacer& pacer, const ScrubKey& key, bool crypto);

}  // namespace weightcache::integrity::internal
