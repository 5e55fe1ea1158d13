// Content digests of resident memory (issues 27, 48): one 64-bit value per 1 MiB chunk of a
// segment, so a change is located to the chunk (and byte range) it touched.
//
// The function is NH (the UMAC family): over the 16-byte words (x, y, z, w) of a chunk, at
// word position i within the chunk,
//   sum_i  (x + K[4i]) * (y + K[4i+1]) + (z + K[4i+2]) * (w + K[4i+3])   mod 2^64
// with 32-bit additions and 32x32->64-bit products. K is a ScrubKey: one secret, uniformly
// random 32-bit key per 32-bit word position of a chunk, drawn from getrandom when the
// process starts and kept in its memory only (docs/integrity.md, "What an engine can
// forge"). For two different chunks of equal length chosen without knowledge of K, the
// values collide with probability at most 2^-32 (NH is 2^-32-almost-universal); whoever
// knows K can balance any edit, which is why K never leaves the process. The sum is
// order-independent, so the GPU reduction (digest_cuda.cu) equals DigestBytes bit for bit.
//
// These values mean something only inside the process that drew the key: what leaves it
// (keeper records, peer records) carries the cryptographic digest (crypto_digest.h).
//
// Thread-safety: pure functions; ProcessKey is drawn once, thread-safely.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace weightcache::integrity {

inline constexpr uint64_t kChunkBytes = 1ull << 20;
// Digested lengths are multiples of this (segment sizes are multiples of the page size).
inline constexpr uint64_t kWordBytes = 16;
// One key per 32-bit word of a chunk.
inline constexpr uint64_t kKeyWords = kChunkBytes / 4;

// The NH key: kKeyWords values (`words[j]` keys the j-th 32-bit word of every chunk).
struct ScrubKey {
  std::vector<uint32_t> words;
};

// A fresh key from getrandom; the process ends, naming the cause, when no random bytes can
// be had.
ScrubKey DrawScrubKey();

// This process's key, drawn with getrandom at the first call (the daemon calls it at start);
// the process ends, naming the cause, when no random bytes can be had. Never logged, never
// sent anywhere; excluded from core dumps.
const ScrubKey& ProcessKey();

// One value per chunk, in order; the last chunk may be shorter than kChunkBytes.
struct SegmentDigest {
  std::vector<uint64_t> chunks;
  // The segment's cryptographic digest (crypto_digest.h: 32 bytes), when it was asked for;
  // empty otherwise.
  std::string sha256;
  // Spelled out: the kernel's translation unit is C++17 (nvcc), without defaulted ==.
  bool operator==(const SegmentDigest& o) const { return chunks == o.chunks && sha256 == o.sha256; }
};

// The value of the `n` bytes at `p` (n a multiple of kWordBytes, at most the rest of the
// chunk), which sit at byte `offset` of their segment (a multiple of kWordBytes): the NH sum
// above over those words, under `key`.
uint64_t DigestBytes(const ScrubKey& key, const std::byte* p, uint64_t n, uint64_t offset);

// The chunk values of `size` bytes at `p`, a whole segment held in host memory.
SegmentDigest DigestHost(const ScrubKey& key, const std::byte* p, uint64_t size);

// Number of chunks of a segment of `size` bytes.
inline size_t ChunkCount(uint64_t size) { return (size + kChunkBytes - 1) / kChunkBytes; }

// Byte ranges [begin, end) of a segment of `size` bytes whose chunk values differ between
// `expected` and `got` (adjacent changed chunks merged). A different chunk count is one
// range over the whole segment.
struct ByteRange {
  uint64_t begin = 0;
  uint64_t end = 0;
};
std::vector<ByteRange> ChangedRanges(const SegmentDigest& expected, const SegmentDigest& got,
                                     uint64_t size);
// "[a, b), [c, d)" for logs; at most `max` ranges, then "and N more".
std::string DescribeRanges(const std::vector<ByteRange>& ranges, size_t max = 4);

// What differs between the digests of the same segments taken twice: "" when nothing, else
// "segment 3 of 8: bytes [a, b) changed; ..." (segments of different chunk counts: the whole
// segment).
std::string DescribeChanges(const std::vector<SegmentDigest>& expected,
                            const std::vector<SegmentDigest>& got);

}  // namespace weightcache::integrity
