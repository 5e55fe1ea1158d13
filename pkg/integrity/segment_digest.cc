#include "pkg/integrity/segment_digest.h"

#include <fcntl.h>

#include <algorithm>
#include <cerrno>
#include <vector>

#include "absl/strings/str_cat.h"
#include "pkg/integrity/crypto_digest.h"
#include "pkg/integrity/internal/digest_cuda.h"
#include "pkg/integrity/internal/pacer.h"
#include "pkg/memory/mapping.h"
#include "pkg/util/errno_status.h"
#include "pkg/util/scoped_fd.h"
#include "pkg/util/status_macros.h"

namespace weightcache::integrity {

absl::StatusOr<SegmentDigest> DigestSegment(memory::BackendKind kind,
                                            const memory::Segment& segment, const Pace& pace,
                                            Want want) {
  const uint64_t size = segment.size();
  if (size % kWordBytes != 0) {
    return absl::InvalidArgumentError(absl::StrCat("digest of a segment of ", size, " bytes on ",
                                                   segment.device_uuid(), ": not a multiple of ",
                                                   kWordBytes));
  }
  const int dup = fcntl(segment.fd(), F_DUPFD_CLOEXEC, 0);
  if (dup < 0) {
    return ErrnoStatus(errno, "digest: dup", absl::StrCat("a segment on ", segment.device_uuid()));
  }
  std::vector<ScopedFd> fds;
  fds.emplace_back(dup);
  WC_ASSIGN_OR_RETURN(auto mapping,
                      memory::MapReadOnly(kind, std::move(fds), {size}, segment.device_uuid()));
  const internal::Pacer pacer(pace);
  const ScrubKey& key = ProcessKey();
  const bool crypto = want == Want::kScrubAndCrypto;
  if (kind == memory::BackendKind::kCudaVmm) {
    return internal::DigestDevice(segment.device_uuid(), mapping->base(0), size, pacer, key,
                                  crypto);
  }
  SegmentDigest d;
  d.chunks.reserve(ChunkCount(size));
  std::string chunk_hashes;
  const std::byte* base = mapping->base(0);
  for (uint64_t piece = 0; piece < size; piece += kPieceBytes) {
    WC_RETURN_IF_ERROR(pacer.Before(piece));
    const uint64_t end = std::min(size, piece + kPieceBytes);
    for (uint64_t off = piece; off < end; off += kChunkBytes) {
      const uint64_t n = std::min(kChunkBytes, end - off);
      d.chunks.push_back(DigestBytes(key, base + off, n, off));
      if (crypto) chunk_hashes += ChunkHashHost(base + off, n);
    }
  }
  if (crypto) d.sha256 = TreeRoot(size, chunk_hashes);
  return d;
}

}  // namespace weightcache::integrity
