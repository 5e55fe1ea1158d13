// The host backend's digest of a segment held in host memory: the pieces in order (pacing
// and stop act between them), the chunks of each piece hashed by several threads at once.
// Private to pkg/integrity (segment_digest.cc) and its tests.
#pragma once

#include <cstddef>
#include <cstdint>

#include "absl/status/statusor.h"
#include "pkg/integrity/digest.h"
#include "pkg/integrity/internal/pacer.h"

namespace weightcache::integrity::internal {

struct HostDigest {
  SegmentDigest digest;
  int threads_used = 0;  // the most threads that hashed chunks of one piece
};

// The digest of the `size` bytes at `base` (the whole segment): scrub chunks under `key`,
// and the cryptographic root when `crypto`. Each piece's chunks are split over
// min(threads, chunks in the piece) threads, thread t taking chunks t, t + T, ... (so each
// takes some); the result is the serial one, bit for bit.
absl::StatusOr<HostDigest> DigestHostPieces(const std::byte* base, uint64_t size,
                                            const Pacer& pacer, const ScrubKey& key, bool crypto,
                                            int threads);

}  // namespace weightcache::integrity::internal
