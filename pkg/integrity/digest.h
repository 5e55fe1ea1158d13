// Content digests of resident memory (issue 27): one 64-bit value per 1 MiB chunk of a
// segment, so a change is located to the chunk (and byte range) it touched.
//
// The function is NH (the UMAC family): over 16-byte words (x, y, z, w) at word position i,
//   sum_i  (x + K(4i)) * (y + K(4i+1)) + (z + K(4i+2)) * (w + K(4i+3))   mod 2^64
// with 32-bit additions, 32x32->64-bit products and a key K derived from the 32-bit word's
// position in its segment. The threat is change, not forgery: any single changed word alters
// its chunk's value unless its partner word plus key is 0 mod 2^32 (probability 2^-32), and
// the sum is order-independent, so a GPU reduction gives the same value as this CPU one.
// The GPU kernel (digest_cuda.cu) computes exactly DigestChunk's value.
//
// Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace weightcache::integrity {

inline constexpr uint64_t kChunkBytes = 1ull << 20;
// Digested lengths are multiples of this (segment sizes are multiples of the page size).
inline constexpr uint64_t kWordBytes = 16;

// The key of 32-bit word `i` of a segment (shared with the kernel).
inline uint32_t NhKey(uint64_t i) {
  uint32_t x =
      static_cast<uint32_t>(i) * 0x9E3779B1u + static_cast<uint32_t>(i >> 32) * 0x85EBCA77u;
  return x ^ (x >> 15);
}

// One value per chunk, in order; the last chunk may be shorter than kChunkBytes.
struct SegmentDigest {
  std::vector<uint64_t> chunks;
  // Spelled out: the kernel's translation unit is C++17 (nvcc), without defaulted ==.
  bool operator==(const SegmentDigest& o) const { return chunks == o.chunks; }
};

// The value of the `n` bytes at `p` (n a multiple of kWordBytes), which sit at byte `offset`
// of their segment (a multiple of kWordBytes): the NH sum above over those words.
uint64_t DigestBytes(const std::byte* p, uint64_t n, uint64_t offset);

// The chunk values of `size` bytes at `p`, a whole segment held in host memory.
SegmentDigest DigestHost(const std::byte* p, uint64_t size);

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

// One value for the whole segment (the chunk values folded in order), for records and logs.
uint64_t Fold(const SegmentDigest& d);

// What differs between the digests of the same segments taken twice: "" when nothing, else
// "segment 3 of 8: bytes [a, b) changed; ..." (segments of different chunk counts: the whole
// segment).
std::string DescribeChanges(const std::vector<SegmentDigest>& expected,
                            const std::vector<SegmentDigest>& got);

}  // namespace weightcache::integrity
