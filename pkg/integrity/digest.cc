#include "pkg/integrity/digest.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace weightcache::integrity {

uint64_t DigestBytes(const std::byte* p, uint64_t n, uint64_t offset) {
  uint64_t acc = 0;
  uint64_t k = offset / 4;  // 32-bit word index in the segment
  for (uint64_t i = 0; i + kWordBytes <= n; i += kWordBytes, k += 4) {
    uint32_t v[4];
    std::memcpy(v, p + i, sizeof v);
    acc += static_cast<uint64_t>(v[0] + NhKey(k)) * (v[1] + NhKey(k + 1)) +
           static_cast<uint64_t>(v[2] + NhKey(k + 2)) * (v[3] + NhKey(k + 3));
  }
  return acc;
}

SegmentDigest DigestHost(const std::byte* p, uint64_t size) {
  SegmentDigest d;
  d.chunks.reserve(ChunkCount(size));
  for (uint64_t off = 0; off < size; off += kChunkBytes) {
    d.chunks.push_back(DigestBytes(p + off, std::min(kChunkBytes, size - off), off));
  }
  return d;
}

std::vector<ByteRange> ChangedRanges(const SegmentDigest& expected, const SegmentDigest& got,
                                     uint64_t size) {
  if (expected.chunks.size() != got.chunks.size()) return {{0, size}};
  std::vector<ByteRange> out;
  for (size_t i = 0; i < got.chunks.size(); ++i) {
    if (expected.chunks[i] == got.chunks[i]) continue;
    const uint64_t begin = i * kChunkBytes;
    const uint64_t end = std::min(size, begin + kChunkBytes);
    if (!out.empty() && out.back().end == begin) {
      out.back().end = end;
    } else {
      out.push_back({begin, end});
    }
  }
  return out;
}

std::string DescribeRanges(const std::vector<ByteRange>& ranges, size_t max) {
  std::string s;
  for (size_t i = 0; i < ranges.size() && i < max; ++i) {
    absl::StrAppend(&s, i == 0 ? "" : ", ", "[", ranges[i].begin, ", ", ranges[i].end, ")");
  }
  if (ranges.size() > max) absl::StrAppend(&s, " and ", ranges.size() - max, " more");
  return s;
}

std::string DescribeChanges(const std::vector<SegmentDigest>& expected,
                            const std::vector<SegmentDigest>& got) {
  if (expected.size() != got.size()) {
    return absl::StrCat(got.size(), " segments where ", expected.size(), " were digested");
  }
  std::string what;
  for (size_t i = 0; i < got.size(); ++i) {
    const auto ranges =
        ChangedRanges(expected[i], got[i],
                      std::max(expected[i].chunks.size(), got[i].chunks.size()) * kChunkBytes);
    if (ranges.empty()) continue;
    absl::StrAppend(&what, what.empty() ? "" : "; ", "segment ", i, " of ", got.size(), ": bytes ",
                    DescribeRanges(ranges), " changed");
  }
  return what;
}

uint64_t Fold(const SegmentDigest& d) {
  uint64_t h = 0xCBF29CE484222325ull ^ d.chunks.size();
  for (uint64_t c : d.chunks) {
    h ^= c;
    h *= 0x100000001B3ull;
    h ^= h >> 29;
  }
  return h;
}

}  // namespace weightcache::integrity
