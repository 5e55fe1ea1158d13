#include "pkg/integrity/segment_digest.h"

#include <fcntl.h>

#include <algorithm>
#include <cerrno>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "pkg/integrity/crypto_digest.h"
#include "pkg/integrity/internal/digest_cuda.h"
#include "pkg/integrity/internal/host_digest.h"
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
  WC_ASSIGN_OR_RETURN(internal::HostDigest d,
                      internal::DigestHostPieces(mapping->base(0), size, pacer, key, crypto,
                                                 std::max(1, pace.threads)));
  return std::move(d.digest);
}

int FillDigestThreads() {
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

namespace internal {

absl::StatusOr<HostDigest> DigestHostPieces(const std::byte* base, uint64_t size,
                                            const Pacer& pacer, const ScrubKey& key, bool crypto,
                                            int threads) {
  HostDigest out;
  const size_t count = ChunkCount(size);
  out.digest.chunks.resize(count);
  std::vector<std::string> hashes(crypto ? count : 0);
  auto hash = [&](size_t c) {
    const uint64_t off = c * kChunkBytes;
    const uint64_t n = std::min(kChunkBytes, size - off);
    out.digest.chunks[c] = DigestBytes(key, base + off, n, off);
    if (crypto) hashes[c] = ChunkHashHost(base + off, n);
  };
  for (uint64_t piece = 0; piece < size; piece += kPieceBytes) {
    WC_RETURN_IF_ERROR(pacer.Before(piece));
    const size_t first = piece / kChunkBytes;
    const size_t last = ChunkCount(std::min(size, piece + kPieceBytes));
    const size_t t_count = std::min<size_t>(static_cast<size_t>(threads), last - first);
    auto stripe = [&](size_t t) {
      for (size_t c = first + t; c < last; c += t_count) hash(c);
    };
    std::vector<std::thread> helpers;
    helpers.reserve(t_count - 1);
    for (size_t t = 1; t < t_count; ++t) helpers.emplace_back(stripe, t);
    stripe(0);
    for (auto& h : helpers) h.join();
    out.threads_used = std::max(out.threads_used, static_cast<int>(t_count));
  }
  if (crypto) {
    std::string chunk_hashes;
    chunk_hashes.reserve(count * kSha256Bytes);
    for (const auto& h : hashes) chunk_hashes += h;
    out.digest.sha256 = TreeRoot(size, chunk_hashes);
  }
  return out;
}

}  // namespace internal

}  // namespace weightcache::integrity
