#include "pkg/integrity/digest.h"

#include <sys/mman.h>
#include <sys/random.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace weightcache::integrity {
namespace {

void Draw(ScrubKey* key) {
  key->words.resize(kKeyWords);
  auto* out = reinterpret_cast<unsigned char*>(key->words.data());
  size_t have = 0;
  const size_t want = key->words.size() * sizeof(uint32_t);
  while (have < want) {
    const ssize_t n = getrandom(out + have, want - have, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      std::fprintf(stderr, "weightcache: the integrity key cannot be drawn: getrandom: %s\n",
                   std::strerror(errno));
      std::abort();
    }
    have += static_cast<size_t>(n);
  }
}

}  // namespace

ScrubKey DrawScrubKey() {
  ScrubKey key;
  Draw(&key);
  return key;
}

const ScrubKey& ProcessKey() {
  static const ScrubKey* key = [] {
    auto* k = new ScrubKey();  // never destroyed: digests may run until the process exits
    Draw(k);
    auto* out = reinterpret_cast<unsigned char*>(k->words.data());
    const size_t want = k->words.size() * sizeof(uint32_t);
    // Not in core dumps (best effort: the pages may share a mapping with other heap data).
    const uintptr_t page = 4096;
    const uintptr_t begin = (reinterpret_cast<uintptr_t>(out) + page - 1) & ~(page - 1);
    const uintptr_t end = (reinterpret_cast<uintptr_t>(out) + want) & ~(page - 1);
    if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTDUMP);
    return k;
  }();
  return *key;
}

uint64_t DigestBytes(const ScrubKey& key, const std::byte* p, uint64_t n, uint64_t offset) {
  uint64_t acc = 0;
  const uint32_t* k = key.words.data() + (offset % kChunkBytes) / 4;  // this word's keys
  for (uint64_t i = 0; i + kWordBytes <= n; i += kWordBytes, k += 4) {
    uint32_t v[4];
    std::memcpy(v, p + i, sizeof v);
    acc += static_cast<uint64_t>(v[0] + k[0]) * (v[1] + k[1]) +
           static_cast<uint64_t>(v[2] + k[2]) * (v[3] + k[3]);
  }
  return acc;
}

SegmentDigest DigestHost(const ScrubKey& key, const std::byte* p, uint64_t size) {
  SegmentDigest d;
  d.chunks.reserve(ChunkCount(size));
  for (uint64_t off = 0; off < size; off += kChunkBytes) {
    d.chunks.push_back(DigestBytes(key, p + off, std::min(kChunkBytes, size - off), off));
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

}  // namespace weightcache::integrity
