// Digests of sealed segments (digest.h under ProcessKey(), and crypto_digest.h when asked),
// computed the way a client sees the memory: the segment's
// descriptor is mapped read-only (memory::MapReadOnly, the client path) and hashed in place
// (digest.h) -- on the GPU by a kernel on a lowest-priority stream for cuda-vmm, on the CPU
// for the host backend (whose sealed memfds cannot change, but take the same path so the
// daemon has one). The mapping ends with the call.
//
// Thread-safety: any thread; several digests may run at once. The segment must stay alive
// for the call (the registry's reference or the caller's).
#pragma once

#include <cstdint>
#include <functional>

#include "absl/status/statusor.h"
#include "pkg/integrity/digest.h"
#include "pkg/memory/backend.h"

namespace weightcache::integrity {

// A digest reads the segment in pieces of this many bytes; pacing and stop act between them.
inline constexpr uint64_t kPieceBytes = 64ull << 20;

struct Pace {
  // Bytes read per second at most, averaged from the digest's start (0: unthrottled).
  double bytes_per_second = 0;
  // Asked before each piece; true stops the digest with CANCELLED.
  std::function<bool()> stop;
  // Host backend: threads that hash each piece's chunks at once (the result is the same
  // for any count). A fill's digest, which the entry waits for, uses every core
  // (FillDigestThreads); a background scrub, paced anyway, keeps one.
  int threads = 1;
};

// The threads a fill's host digest uses: this machine's cores.
int FillDigestThreads();

// What a digest computes: the scrub digest under this process's key (always), and the
// cryptographic digest too (crypto_digest.h) -- at fill time, for records and adoption.
enum class Want { kScrub, kScrubAndCrypto };

// The digest of sealed segment `segment` of backend `kind`. INVALID_ARGUMENT when its size is
// not a multiple of kWordBytes; the mapping's or the device's error otherwise (naming the
// segment's device); CANCELLED when `pace.stop` said so.
absl::StatusOr<SegmentDigest> DigestSegment(memory::BackendKind kind,
                                            const memory::Segment& segment, const Pace& pace,
                                            Want want = Want::kScrub);

}  // namespace weightcache::integrity
