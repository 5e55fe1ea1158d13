// The digest kernel on a real GPU (label gpu): equal to the CPU digest of the same bytes,
// a byte changed through a writable import is found in its chunk, a stopped digest ends.
#include <cuda_runtime.h>
#include <unistd.h>

#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "pkg/integrity/digest.h"
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

  auto gpu = DigestSegment(memory::BackendKind::kCudaVmm, **seg, {});
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  const SegmentDigest cpu = DigestHost(bytes.data(), size);
  ASSERT_EQ(gpu->chunks.size(), cpu.chunks.size());
  EXPECT_EQ(*gpu, cpu);

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
  auto after = DigestSegment(memory::BackendKind::kCudaVmm, **seg, {});
  ASSERT_TRUE(after.ok()) << after.status();
  const auto ranges = ChangedRanges(*gpu, *after, size);
  ASSERT_EQ(ranges.size(), 1u);
  EXPECT_EQ(ranges[0].begin, at / kChunkBytes * kChunkBytes);

  Pace pace;
  pace.stop = [] { return true; };
  EXPECT_EQ(DigestSegment(memory::BackendKind::kCudaVmm, **seg, pace).status().code(),
            absl::StatusCode::kCancelled);
}

}  // namespace
}  // namespace weightcache::integrity
