#include <chrono>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "pkg/integrity/digest.h"
#include "pkg/integrity/segment_digest.h"
#include "pkg/memory/backend.h"

namespace weightcache::integrity {
namespace {

std::vector<std::byte> RandomBytes(size_t n, uint32_t seed) {
  std::vector<std::byte> b(n);
  std::mt19937 rng(seed);
  for (auto& x : b) x = static_cast<std::byte>(rng());
  return b;
}

// The function is pinned: digests outlive a daemon (keeper records, peers) and the GPU
// kernel must compute the same values, so a change to it must be deliberate.
TEST(Digest, KnownAnswer) {
  std::vector<std::byte> b(3 * kChunkBytes / 2);
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<std::byte>(i * 131 + (i >> 12));
  const SegmentDigest d = DigestHost(b.data(), b.size());
  ASSERT_EQ(d.chunks.size(), 2u);
  EXPECT_EQ(d.chunks[0], 0xbfa20e8fe1f271f0ull);
  EXPECT_EQ(d.chunks[1], 0x124c75a5c446dd48ull);
}

TEST(Digest, AnyFlippedBitChangesExactlyItsChunk) {
  const uint64_t size = 8 * kChunkBytes;
  auto b = RandomBytes(size, 1);
  const SegmentDigest clean = DigestHost(b.data(), size);
  std::mt19937_64 rng(2);
  for (int trial = 0; trial < 64; ++trial) {
    const uint64_t at = rng() % size;
    const auto bit = static_cast<std::byte>(1u << (rng() % 8));
    b[at] ^= bit;
    const SegmentDigest dirty = DigestHost(b.data(), size);
    b[at] ^= bit;
    const auto ranges = ChangedRanges(clean, dirty, size);
    ASSERT_EQ(ranges.size(), 1u) << "byte " << at;
    EXPECT_EQ(ranges[0].begin, at / kChunkBytes * kChunkBytes);
    EXPECT_EQ(ranges[0].end, ranges[0].begin + kChunkBytes);
  }
  EXPECT_EQ(DigestHost(b.data(), size), clean);
}

TEST(Digest, MovedBytesAreAChange) {
  // The key depends on the position: two chunks swapped, or one word moved, differ.
  const uint64_t size = 2 * kChunkBytes;
  auto b = RandomBytes(size, 3);
  const SegmentDigest clean = DigestHost(b.data(), size);
  std::vector<std::byte> swapped(size);
  std::memcpy(swapped.data(), b.data() + kChunkBytes, kChunkBytes);
  std::memcpy(swapped.data() + kChunkBytes, b.data(), kChunkBytes);
  const auto ranges = ChangedRanges(clean, DigestHost(swapped.data(), size), size);
  ASSERT_EQ(ranges.size(), 1u);
  EXPECT_EQ(ranges[0].begin, 0u);
  EXPECT_EQ(ranges[0].end, size);                               // adjacent chunks merged
  std::swap_ranges(b.begin(), b.begin() + 16, b.begin() + 16);  // two words swapped
  EXPECT_NE(DigestHost(b.data(), size).chunks[0], clean.chunks[0]);
}

TEST(Digest, RangesAreDescribedForTheLog) {
  SegmentDigest a{{1, 2, 3, 4, 5}}, b{{1, 9, 9, 4, 9}};
  const auto r = ChangedRanges(a, b, 4 * kChunkBytes + 4096);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(DescribeRanges(r), "[1048576, 3145728), [4194304, 4198400)");
  EXPECT_EQ(DescribeRanges(r, 1), "[1048576, 3145728) and 1 more");
  EXPECT_EQ(ChangedRanges(a, SegmentDigest{{1}}, 100).size(), 1u);
  EXPECT_NE(Fold(a), Fold(b));
}

TEST(Digest, ChangesAcrossSegmentsAreNamed) {
  const std::vector<SegmentDigest> a = {{{1, 2}}, {{3, 4, 5}}};
  auto b = a;
  EXPECT_EQ(DescribeChanges(a, b), "");
  b[1].chunks[2] = 9;
  EXPECT_EQ(DescribeChanges(a, b), "segment 1 of 2: bytes [2097152, 3145728) changed");
  EXPECT_EQ(DescribeChanges(a, {a[0]}), "1 segments where 2 were digested");
}

class SegmentDigestTest : public ::testing::Test {
 protected:
  std::unique_ptr<memory::Segment> Sealed(const std::vector<std::byte>& bytes) {
    auto seg = backend_->Allocate("", bytes.size(), "digest-test");
    EXPECT_TRUE(seg.ok()) << seg.status();
    std::memcpy((*seg)->host_data(), bytes.data(), bytes.size());
    EXPECT_TRUE((*seg)->Seal().ok());
    return std::move(seg).value();
  }
  std::unique_ptr<memory::Backend> backend_ = memory::MakeHostBackend();
};

TEST_F(SegmentDigestTest, AHostSegmentsDigestIsItsBytesDigest) {
  const auto bytes = RandomBytes(3 * kPieceBytes / 2, 4);
  auto seg = Sealed(bytes);
  auto d = DigestSegment(memory::BackendKind::kHost, *seg, {});
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(*d, DigestHost(bytes.data(), bytes.size()));
}

TEST_F(SegmentDigestTest, PacingHoldsTheBudgetAndStopEndsIt) {
  // Two pieces at kPieceBytes per 0.2 s: the second may start only 0.2 s after the first.
  const auto bytes = RandomBytes(2 * kPieceBytes, 5);
  auto seg = Sealed(bytes);
  Pace pace;
  pace.bytes_per_second = kPieceBytes / 0.2;
  const auto t0 = std::chrono::steady_clock::now();
  auto d = DigestSegment(memory::BackendKind::kHost, *seg, pace);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_GE(secs, 0.2);
  int asked = 0;
  pace.bytes_per_second = 0;
  pace.stop = [&] { return ++asked == 2; };
  auto stopped = DigestSegment(memory::BackendKind::kHost, *seg, pace);
  EXPECT_EQ(stopped.status().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(asked, 2);
}

}  // namespace
}  // namespace weightcache::integrity
