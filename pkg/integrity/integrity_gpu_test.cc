// The digest kernels on a real GPU (label gpu): equal to the CPU digests of the same bytes,
// a byte changed through a writable import is found in its chunk, a stopped digest ends.
#include <cuda_runtime.h>
#include <unistd.h>

#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "pkg/integrity/crypto_digest.h"
#include "pkg/integrity/digest.h"
#include "pkg/integrity/internal/digest_cuda.h"
#include "pkg/integrity/internal/pacer.h"
#include "pkg/integrity/segment_digest.h"
#include "pkg/memory/backend.h"
#include "pkg/memory/cuda_backend.h"
#include "pkg/memory/internal/cuda_segment.h"
#include "pkg/memory/mapping.h"

namespace weightcache::integrity {
namespace {

class IntegrityGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto b = memory::MakeCudaBackend({});
    if (!b.ok()) GTEST_SKIP() << "no usable GPU: " << b.status();
    backend_ = std::move(b).value();
  }
  std::unique_ptr<memory::Backend> backend_;
};

TEST_F(IntegrityGpuTest, TheKernelsDigestIsTheCpuDigestAndFindsAChangedByte) {
  const uint64_t size = 3 * kPieceBytes + 10 * kChunkBytes + 2 * 1024 * 1024;  // pieces, tail
  std::vector<std::byte> bytes(size);
  std::mt19937 rng(7);
  for (auto& x : bytes) x = static_cast<std::byte>(rng());
  auto seg = backend_->Allocate("", size, "digest-gpu-test");
  ASSERT_TRUE(seg.ok()) << seg.status();
  ASSERT_EQ((*seg)->size(), size);
  ASSERT_TRUE((*seg)->CopyIn(0, bytes.data(), size).ok());
  ASSERT_TRUE((*seg)->Seal().ok());

  auto gpu = DigestSegment(memory::BackendKind::kCudaVmm, **seg, {}, Want::kScrubAndCrypto);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  SegmentDigest cpu = DigestHost(ProcessKey(), bytes.data(), size);
  cpu.sha256 = CryptoDigestHost(bytes.data(), size);
  ASSERT_EQ(gpu->chunks.size(), cpu.chunks.size());
  EXPECT_EQ(gpu->chunks, cpu.chunks);
  EXPECT_EQ(CryptoDigestText(gpu->sha256), CryptoDigestText(cpu.sha256));

  // Another process's writable import, as an engine could make: one byte changed.
  std::vector<ScopedFd> fds;
  fds.emplace_back(dup((*seg)->fd()));
  auto writable = memory::MapWritable(memory::BackendKind::kCudaVmm, std::move(fds), {size},
                                      (*seg)->device_uuid());
  ASSERT_TRUE(writable.ok()) << writable.status();
  const uint64_t at = 2 * kPieceBytes + 5 * kChunkBytes + 12345;
  const std::byte evil{0x5a};
  ASSERT_NE(bytes[at], evil);
  auto ordinal = memory::internal::CudaOrdinalOfUuid((*seg)->device_uuid());
  ASSERT_TRUE(ordinal.ok()) << ordinal.status();
  ASSERT_EQ(cudaSetDevice(*ordinal), cudaSuccess);
  ASSERT_EQ(cudaMemcpy((*writable)->writable_base(0) + at, &evil, 1, cudaMemcpyHostToDevice),
            cudaSuccess);
  writable->reset();
  auto after = DigestSegment(memory::BackendKind::kCudaVmm, **seg, {}, Want::kScrubAndCrypto);
  ASSERT_TRUE(after.ok()) << after.status();
  const auto ranges = ChangedRanges(*gpu, *after, size);
  ASSERT_EQ(ranges.size(), 1u);
  EXPECT_EQ(ranges[0].begin, at / kChunkBytes * kChunkBytes);
  EXPECT_NE(after->sha256, gpu->sha256);

  Pace pace;
  pace.stop = [] { return true; };
  EXPECT_EQ(DigestSegment(memory::BackendKind::kCudaVmm, **seg, pace).status().code(),
            absl::StatusCode::kCancelled);
}

// Both kernels bit for bit against the CPU at sizes whose last leaf and chunk are short (a
// segment is any multiple of 16 bytes), under two keys, through the device path directly.
TEST_F(IntegrityGpuTest, BothKernelsEqualTheCpuAtEveryShape) {
  const ScrubKey other = DrawScrubKey();
  const std::vector<uint64_t> sizes = {16,
                                       48,
                                       64,
                                       kLeafBytes - 16,
                                       kLeafBytes + 48,
                                       kChunkBytes - 16,
                                       kChunkBytes,
                                       3 * kChunkBytes + 5 * kLeafBytes + 32,
                                       kPieceBytes + kChunkBytes / 2};
  const uint64_t most = sizes.back();
  std::vector<std::byte> bytes(most);
  std::mt19937 rng(8);
  for (auto& x : bytes) x = static_cast<std::byte>(rng());
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  void* dev = nullptr;
  ASSERT_EQ(cudaMalloc(&dev, most), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(dev, bytes.data(), most, cudaMemcpyHostToDevice), cudaSuccess);
  const std::string uuid = backend_->Devices().at(0).uuid;
  for (const ScrubKey* key : {&ProcessKey(), &other}) {
    for (uint64_t size : sizes) {
      for (double rate : {0.0, 1e12}) {  // unthrottled spans and paced pieces
        Pace pace;
        pace.bytes_per_second = rate;
        const internal::Pacer pacer(pace);
        auto gpu = internal::DigestDevice(uuid, static_cast<const std::byte*>(dev), size, pacer,
                                          *key, true);
        ASSERT_TRUE(gpu.ok()) << gpu.status();
        EXPECT_EQ(gpu->chunks, DigestHost(*key, bytes.data(), size).chunks) << size;
        EXPECT_EQ(CryptoDigestText(gpu->sha256),
                  CryptoDigestText(CryptoDigestHost(bytes.data(), size)))
            << size;
      }
    }
  }
  cudaFree(dev);
}

}  // namespace
}  // namespace weightcache::integrity
