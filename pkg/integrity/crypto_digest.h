// Cryptographic digests of segments (issue 48): what vouches for resident bytes outside the
// process that holds them -- in keeper records (a restarted daemon adopts only memory whose
// digests match) and in peer records (a filling daemon checks the bytes it pulled). Unlike
// the scrub digest (digest.h), whose key is secret to one process, anyone can compute these,
// and nobody can make two different segments with equal values (SHA-256's collision
// resistance).
//
// The function, "sha256-tree v1", is a fixed-shape tree of SHA-256 so that a GPU computes it
// in parallel (digest_cuda.cu: one thread per leaf, one per chunk) and OpenSSL's SHA-256 is
// its CPU reference:
//   leaf  = SHA-256(kLeafBytes bytes of the segment)      (a segment's last may be shorter)
//   chunk = SHA-256(the values of its leaves, in order)   (per kChunkBytes chunk)
//   root  = SHA-256("weightcache sha256-tree v1" || size, 8 bytes little-endian
//                   || the values of its chunks, in order)
// The shape follows from the size alone and the size is in the root, so two segments share a
// root only if SHA-256 collides somewhere in the tree.
//
// Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "pkg/integrity/digest.h"

namespace weightcache::integrity {

inline constexpr uint64_t kLeafBytes = 16ull << 10;
inline constexpr uint64_t kLeavesPerChunk = kChunkBytes / kLeafBytes;
inline constexpr size_t kSha256Bytes = 32;

// The value of one chunk (at most kChunkBytes bytes at `p`): 32 raw bytes.
std::string ChunkHashHost(const std::byte* p, uint64_t n);

// The root over `chunks` chunk values (32 raw bytes each, concatenated in `chunk_hashes`) of a
// segment of `size` bytes: 32 raw bytes.
std::string TreeRoot(uint64_t size, const std::string& chunk_hashes);

// The root of `size` bytes at `p`, a whole segment held in host memory.
std::string CryptoDigestHost(const std::byte* p, uint64_t size);

// "sha256t:<64 hex digits>" for logs, records read by people and `weightcachectl`; "none"
// when `raw` is empty.
std::string CryptoDigestText(const std::string& raw);

}  // namespace weightcache::integrity
