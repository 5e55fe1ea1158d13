#include <chrono>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "pkg/integrity/crypto_digest.h"
#include "pkg/integrity/digest.h"
#include "pkg/integrity/internal/host_digest.h"
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

// The key of issue 27: a public function of the word's position (here within a chunk), which
// let anyone who read digest.h balance an edit.
ScrubKey PublicKey() {
  ScrubKey k;
  k.words.resize(kKeyWords);
  for (uint64_t i = 0; i < kKeyWords; ++i) {
    uint32_t x = static_cast<uint32_t>(i) * 0x9E3779B1u;
    k.words[i] = x ^ (x >> 15);
  }
  return k;
}

// The function is pinned for a given key: the GPU kernel must compute the same values, so a
// change to it must be deliberate. (Both values were computed with Python from the definition;
// chunk 0 is issue 27's value, whose key was this one there.)
TEST(Digest, KnownAnswer) {
  std::vector<std::byte> b(3 * kChunkBytes / 2);
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<std::byte>(i * 131 + (i >> 12));
  const SegmentDigest d = DigestHost(PublicKey(), b.data(), b.size());
  ASSERT_EQ(d.chunks.size(), 2u);
  EXPECT_EQ(d.chunks[0], 0xbfa20e8fe1f271f0ull);
  EXPECT_EQ(d.chunks[1], 0x64005f5abebbe6c8ull);
}

// Issue 48's forgery: an engine holding a writable import sets a word pair to chosen values
// and keeps its chunk's digest, x' = y + K1 - K0, y' = x + K0 - K1 (mod 2^32), which needs K.
// Under the public key the digest does not change; under a secret key it does (all but
// 2^-32 of keys), for every pair tried.
TEST(Digest, ABalancedSwapKeepsThePublicKeysDigestButNotASecretKeys) {
  const uint64_t size = kChunkBytes;
  auto b = RandomBytes(size, 9);
  const ScrubKey pub = PublicKey();
  const ScrubKey& secret = ProcessKey();
  const SegmentDigest pub_clean = DigestHost(pub, b.data(), size);
  const SegmentDigest secret_clean = DigestHost(secret, b.data(), size);
  std::mt19937_64 rng(10);
  for (int trial = 0; trial < 32; ++trial) {
    const uint64_t w = (rng() % (size / kWordBytes)) * 4;  // 32-bit word index, x of a word
    auto forged = b;
    uint32_t x, y;
    std::memcpy(&x, forged.data() + 4 * w, 4);
    std::memcpy(&y, forged.data() + 4 * w + 4, 4);
    const uint32_t k0 = pub.words[w], k1 = pub.words[w + 1];
    const uint32_t x2 = y + k1 - k0, y2 = x + k0 - k1;
    if (x2 == x && y2 == y) continue;  // the pair was already balanced
    std::memcpy(forged.data() + 4 * w, &x2, 4);
    std::memcpy(forged.data() + 4 * w + 4, &y2, 4);
    EXPECT_EQ(DigestHost(pub, forged.data(), size), pub_clean) << "word " << w;
    EXPECT_NE(DigestHost(secret, forged.data(), size), secret_clean) << "word " << w;
  }
}

TEST(Digest, EveryProcessDrawsItsOwnKey) {
  const ScrubKey a = DrawScrubKey(), b = DrawScrubKey();
  ASSERT_EQ(a.words.size(), kKeyWords);
  EXPECT_NE(a.words, b.words);
  EXPECT_NE(a.words, PublicKey().words);
  EXPECT_EQ(&ProcessKey(), &ProcessKey());  // drawn once
  // Uniform enough that every bit position is set in about half the words.
  for (int bit = 0; bit < 32; ++bit) {
    size_t ones = 0;
    for (uint32_t w : a.words) ones += (w >> bit) & 1;
    EXPECT_NEAR(static_cast<double>(ones) / kKeyWords, 0.5, 0.01) << "bit " << bit;
  }
}

TEST(Digest, AnyFlippedBitChangesExactlyItsChunk) {
  const uint64_t size = 8 * kChunkBytes;
  auto b = RandomBytes(size, 1);
  const ScrubKey& key = ProcessKey();
  const SegmentDigest clean = DigestHost(key, b.data(), size);
  std::mt19937_64 rng(2);
  for (int trial = 0; trial < 64; ++trial) {
    const uint64_t at = rng() % size;
    const auto bit = static_cast<std::byte>(1u << (rng() % 8));
    b[at] ^= bit;
    const SegmentDigest dirty = DigestHost(key, b.data(), size);
    b[at] ^= bit;
    const auto ranges = ChangedRanges(clean, dirty, size);
    ASSERT_EQ(ranges.size(), 1u) << "byte " << at;
    EXPECT_EQ(ranges[0].begin, at / kChunkBytes * kChunkBytes);
    EXPECT_EQ(ranges[0].end, ranges[0].begin + kChunkBytes);
  }
  EXPECT_EQ(DigestHost(key, b.data(), size), clean);
}

TEST(Digest, MovedBytesAreAChange) {
  // Chunks are compared in place, and the key depends on the position within a chunk: two
  // different chunks swapped, or two words of one chunk swapped, differ.
  const uint64_t size = 2 * kChunkBytes;
  auto b = RandomBytes(size, 3);
  const ScrubKey& key = ProcessKey();
  const SegmentDigest clean = DigestHost(key, b.data(), size);
  std::vector<std::byte> swapped(size);
  std::memcpy(swapped.data(), b.data() + kChunkBytes, kChunkBytes);
  std::memcpy(swapped.data() + kChunkBytes, b.data(), kChunkBytes);
  const auto ranges = ChangedRanges(clean, DigestHost(key, swapped.data(), size), size);
  ASSERT_EQ(ranges.size(), 1u);
  EXPECT_EQ(ranges[0].begin, 0u);
  EXPECT_EQ(ranges[0].end, size);                               // adjacent chunks merged
  std::swap_ranges(b.begin(), b.begin() + 16, b.begin() + 16);  // two words swapped
  EXPECT_NE(DigestHost(key, b.data(), size).chunks[0], clean.chunks[0]);
}

// sha256-tree v1 (crypto_digest.h), pinned: records outlive a daemon and cross nodes, and
// the GPU kernel must compute the same value. The expected roots were computed with
// Python's hashlib from the definition (leaf, chunk, root), not with this code.
TEST(CryptoDigest, KnownAnswer) {
  std::vector<std::byte> b(kChunkBytes + 3 * kLeafBytes + 48);
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<std::byte>(i * 131 + (i >> 12));
  EXPECT_EQ(CryptoDigestText(CryptoDigestHost(b.data(), b.size())),
            "sha256t:19c5bf07d26fa8291b7bda439ec6160515c76584f05339cd300d9795fcbf826c");
  EXPECT_EQ(CryptoDigestText(CryptoDigestHost(b.data(), 16)),
            "sha256t:2e598f51dd8d6821601d4ffe8f0e38b8fcbab17571c497af5c11a3d000060516");
  EXPECT_EQ(CryptoDigestText(""), "none");
}

TEST(CryptoDigest, AnyChangeAndTheSizeChangeIt) {
  auto b = RandomBytes(2 * kChunkBytes, 11);
  const std::string clean = CryptoDigestHost(b.data(), b.size());
  ASSERT_EQ(clean.size(), kSha256Bytes);
  std::mt19937_64 rng(12);
  for (int trial = 0; trial < 16; ++trial) {
    const uint64_t at = rng() % b.size();
    b[at] ^= std::byte{1};
    EXPECT_NE(CryptoDigestHost(b.data(), b.size()), clean) << "byte " << at;
    b[at] ^= std::byte{1};
  }
  // Zeros appended: the same leaves where both have them, another size in the root.
  std::vector<std::byte> longer(b);
  longer.resize(b.size() + kLeafBytes);
  EXPECT_NE(CryptoDigestHost(longer.data(), longer.size()), clean);
  EXPECT_EQ(CryptoDigestHost(b.data(), b.size()), clean);
}

TEST(Digest, RangesAreDescribedForTheLog) {
  SegmentDigest a{{1, 2, 3, 4, 5}, {}}, b{{1, 9, 9, 4, 9}, {}};
  const auto r = ChangedRanges(a, b, 4 * kChunkBytes + 4096);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(DescribeRanges(r), "[1048576, 3145728), [4194304, 4198400)");
  EXPECT_EQ(DescribeRanges(r, 1), "[1048576, 3145728) and 1 more");
  EXPECT_EQ(ChangedRanges(a, SegmentDigest{{1}, {}}, 100).size(), 1u);
}

TEST(Digest, ChangesAcrossSegmentsAreNamed) {
  const std::vector<SegmentDigest> a = {{{1, 2}, {}}, {{3, 4, 5}, {}}};
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
  EXPECT_EQ(*d, DigestHost(ProcessKey(), bytes.data(), bytes.size()));
  EXPECT_TRUE(d->sha256.empty());  // a scrub reads only what it compares
  auto both = DigestSegment(memory::BackendKind::kHost, *seg, {}, Want::kScrubAndCrypto);
  ASSERT_TRUE(both.ok()) << both.status();
  EXPECT_EQ(both->chunks, d->chunks);
  EXPECT_EQ(both->sha256, CryptoDigestHost(bytes.data(), bytes.size()));
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

// A fill's host digest hashes each piece's chunks on several threads: the result is the
// serial digest bit for bit (scrub chunks and the cryptographic root, over a segment whose
// last piece and last chunk are short), and more than one thread took chunks.
TEST_F(SegmentDigestTest, ParallelDigestEqualsTheSerialOneAndUsesSeveralThreads) {
  const uint64_t size = kPieceBytes + 5 * kChunkBytes / 2;  // a short last piece and chunk
  const auto bytes = RandomBytes(size, 6);
  const SegmentDigest serial{DigestHost(ProcessKey(), bytes.data(), size).chunks,
                             CryptoDigestHost(bytes.data(), size)};
  const Pace unpaced;  // the Pacer keeps a reference: it must outlive it
  for (int threads : {1, 3, 4}) {
    const internal::Pacer pacer(unpaced);
    auto d = internal::DigestHostPieces(bytes.data(), size, pacer, ProcessKey(), true, threads);
    ASSERT_TRUE(d.ok()) << d.status();
    EXPECT_EQ(d->digest, serial) << threads << " threads";
    EXPECT_EQ(d->threads_used, threads);
  }
  // Through DigestSegment, as a fill asks for it (the segment is rounded up to the granule:
  // compared with its serial digest).
  auto seg = Sealed(bytes);
  Pace pace;
  auto one = DigestSegment(memory::BackendKind::kHost, *seg, pace, Want::kScrubAndCrypto);
  pace.threads = 4;
  auto d = DigestSegment(memory::BackendKind::kHost, *seg, pace, Want::kScrubAndCrypto);
  ASSERT_TRUE(one.ok() && d.ok());
  EXPECT_EQ(*d, *one);
  EXPECT_GE(FillDigestThreads(), 1);
}

}  // namespace
}  // namespace weightcache::integrity
