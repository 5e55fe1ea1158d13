// GPU tests of online block-FP8 quantization (ctest label gpu; they skip with the reason on
// a machine without a usable GPU):
//  - the CUDA kernel equals the CPU quantizer (fp8_quant.h) bit for bit, codes and scales,
//    on seeded random BF16/F16 data with ragged edges, subnormals, zeros, +-Inf, NaN, huge
//    values and all-zero and tiny-amax blocks, through both the fast and the generic kernel;
//  - the loader's cuda-vmm path (pinned staging -> device scratch -> kernel -> segment)
//    serves a bf16 Llama at tp 2 with `quantization: fp8_block` byte-identical to the CPU
//    quantizer applied to each original shard.
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "pkg/load/fp8_quant.h"
#include "pkg/load/internal/fp8_kernel_testing.h"
#include "pkg/load/internal/fp8_math.h"
#include "pkg/load/internal/fp8_quant_cuda.h"
#include "pkg/load/internal/fp8_quant_cuda_testing.h"
#include "pkg/load/loader.h"
#include "pkg/load/model.h"
#include "pkg/load/pieces.h"
#include "pkg/load/plan.h"
#include "pkg/memory/cuda_backend.h"
#include "pkg/memory/mapping.h"
#include "pkg/safetensors/writer.h"
#include "pkg/util/scoped_fd.h"
#include "tests/testutil/temp_dir.h"

namespace weightcache::load {
namespace {

using safetensors::DType;

#define REQUIRE_GPU()                                                             \
  if (internal::GpuCount() == 0) {                                                \
    GTEST_SKIP() << "no usable GPU (cudaGetDeviceCount found none or no driver)"; \
  }

// Random 16-bit floats: mostly normal values of a few binades, plus specials.
std::vector<uint16_t> RandomHalves(DType dtype, size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint16_t> v(n);
  const bool bf16 = dtype == DType::kBF16;
  for (auto& x : v) {
    const uint64_t r = rng();
    const uint16_t sign = (r & 1) ? 0x8000 : 0;
    switch ((r >> 1) % 64) {
      case 0:
        x = sign;
        break;  // +-0
      case 1:
        x = sign | (bf16 ? 0x7F80 : 0x7C00);
        break;  // +-Inf
      case 2:
        x = sign | (bf16 ? 0x7FC1 : 0x7E01);
        break;  // NaN
      case 3:
        x = sign | static_cast<uint16_t>((r >> 8) & (bf16 ? 0x7F : 0x3FF));
        break;  // subnormal
      case 4:
        x = sign | (bf16 ? 0x7F7F : 0x7BFF);
        break;  // the largest finite
      default: {
        // Normal, exponent spread of 2^-12 .. 2^11 around 1.
        const uint16_t e = static_cast<uint16_t>((bf16 ? 115 : 3) + (r >> 8) % 24);
        const uint16_t m = static_cast<uint16_t>((r >> 16) & (bf16 ? 0x7F : 0x3FF));
        x = sign | static_cast<uint16_t>(e << (bf16 ? 7 : 10)) | m;
      }
    }
  }
  return v;
}

// Makes some blocks special: all zero, tiny (subnormal scale), huge (saturating neighbours).
void ShapeBlocks(DType dtype, std::vector<uint16_t>& v, int64_t rows, int64_t cols) {
  const bool bf16 = dtype == DType::kBF16;
  for (int64_t r = 0; r < std::min<int64_t>(rows, 128); ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const int64_t bj = c / 128;
      uint16_t& x = v[static_cast<size_t>(r * cols + c)];
      if (bj % 4 == 1) x = 0;                                  // an all-zero block
      if (bj % 4 == 2) x = static_cast<uint16_t>(x & 0x8003);  // tiny subnormals only
      if (bj % 4 == 3)
        x = static_cast<uint16_t>((x & 0x8000) | (bf16 ? 0x0080 : 0x0400));  // smallest normals
    }
  }
}

struct Case {
  DType dtype;
  int64_t rows, cols;
  int br, bc;
};

TEST(Fp8Gpu, KernelEqualsCpuBitForBit) {
  REQUIRE_GPU();
  const Case cases[] = {
      {DType::kBF16, 128, 128, 128, 128}, {DType::kBF16, 300, 520, 128, 128},  // ragged, fast
      {DType::kBF16, 257, 131, 128, 128}, {DType::kBF16, 1, 8, 128, 128},      // generic
      {DType::kBF16, 129, 1, 128, 128},   {DType::kBF16, 1000, 4096, 128, 128},
      {DType::kF16, 384, 1024, 128, 128}, {DType::kF16, 77, 300, 128, 128},
      {DType::kBF16, 200, 200, 64, 32},   {DType::kBF16, 4096, 11008, 128, 128},
  };
  for (internal::Fp8Variant variant :
       {internal::Fp8Variant::kReference, internal::Fp8Variant::kFastInt,
        internal::Fp8Variant::kFastCvt}) {
    SCOPED_TRACE(absl::StrCat("kernel variant ", static_cast<int>(variant)));
    uint64_t seed = 1;
    for (const Case& c : cases) {
      SCOPED_TRACE(absl::StrCat(std::string(safetensors::DTypeName(c.dtype)), " [", c.rows, ", ",
                                c.cols, "] block ", c.br, "x", c.bc));
      auto src = RandomHalves(c.dtype, static_cast<size_t>(c.rows * c.cols), seed++);
      ShapeBlocks(c.dtype, src, c.rows, c.cols);
      const size_t n = static_cast<size_t>(c.rows * c.cols);
      const size_t ns =
          static_cast<size_t>(((c.rows + c.br - 1) / c.br) * ((c.cols + c.bc - 1) / c.bc));
      std::vector<uint8_t> cpu(n), gpu(n, 0xAA);
      std::vector<float> cpu_s(ns), gpu_s(ns, -1.0f);
      ASSERT_TRUE(QuantizeFp8Block(c.dtype, src.data(), c.rows, c.cols, c.br, c.bc, cpu.data(),
                                   cpu_s.data())
                      .ok());
      auto st = internal::QuantizeFp8BlockOnGpu(0, c.dtype, src.data(), c.rows, c.cols, c.br, c.bc,
                                                gpu.data(), gpu_s.data(), variant);
      ASSERT_TRUE(st.ok()) << st;
      size_t bad = 0;
      for (size_t i = 0; i < n && bad < 5; ++i) {
        if (cpu[i] != gpu[i]) {
          ++bad;
          ADD_FAILURE() << "element " << i << " (row " << i / c.cols << ", col " << i % c.cols
                        << ", input 0x" << std::hex << src[i] << "): cpu 0x" << int{cpu[i]}
                        << ", gpu 0x" << int{gpu[i]};
        }
      }
      EXPECT_EQ(std::memcmp(cpu_s.data(), gpu_s.data(), ns * sizeof(float)), 0)
          << "scales differ; first: cpu " << cpu_s[0] << " gpu " << gpu_s[0];
      EXPECT_EQ(cpu, gpu);
    }
  }
}

// The proofs behind the fast kernel variants (fp8_quant.cu, internal/fp8_math.h): exhaustive,
// so "equal" is a fact about every input the kernel can meet, not about a sample.
TEST(Fp8Gpu, HardwareCvtEqualsSharedFunctionOverAllFloats) {
  REQUIRE_GPU();
  uint64_t finite = 1, nan = 0, widen = 1;
  ASSERT_EQ(internal::kernel::CountCvtMismatches(0, &finite, &nan, &widen), 0);
  // cvt.rn.satfinite.e4m3x2.f32 == Fp8FloatToE4M3 for all 2^32 - 2^24 non-NaN floats
  // (normal, subnormal, zero, +-Inf). NaN inputs never reach it (the kernel answers them
  // with Fp8QuantizeElement); how many of them differ is printed for the record.
  std::printf(
      "cvt.rn.satfinite.e4m3x2.f32 vs Fp8FloatToE4M3: %llu mismatches over the "
      "2^32 - 2^24 non-NaN floats; %llu of the 2^24 NaNs differ (never converted)\n",
      static_cast<unsigned long long>(finite), static_cast<unsigned long long>(nan));
  EXPECT_EQ(finite, 0u);
  // The hardware f16 -> f32 widening == Fp8HalfToFloat for every non-NaN f16.
  EXPECT_EQ(widen, 0u);
}

TEST(Fp8Gpu, FastElementEqualsSharedFunctionExhaustively) {
  REQUIRE_GPU();
  for (internal::Fp8Variant variant :
       {internal::Fp8Variant::kFastInt, internal::Fp8Variant::kFastCvt}) {
    for (bool bf16 : {true, false}) {
      SCOPED_TRACE(absl::StrCat("variant ", static_cast<int>(variant), bf16 ? " bf16" : " f16"));
      uint64_t in_domain = 1, outside = 0, pairs = 0;
      ASSERT_EQ(internal::kernel::CountFastElementMismatches(0, variant, bf16, &in_domain, &outside,
                                                             &pairs),
                0);
      std::printf(
          "fast element path, variant %d, %s: %llu (amax, x) pairs on the fast path, "
          "%llu mismatches; %llu mismatches off it (never used)\n",
          static_cast<int>(variant), bf16 ? "bf16" : "f16", static_cast<unsigned long long>(pairs),
          static_cast<unsigned long long>(in_domain), static_cast<unsigned long long>(outside));
      EXPECT_EQ(in_domain, 0u);
      // Every pair was tried: each finite amax with a fast scale, times every finite x with
      // |x| <= amax (both signs). H200, 2026-11-29: 981047202 (bf16), 1007713280 (f16).
      uint64_t want = 0;
      for (uint32_t a = 0; a < (bf16 ? 0x7F80u : 0x7C00u); ++a) {
        const float amax =
            bf16 ? Bf16ToFloat(static_cast<uint16_t>(a)) : HalfToFloat(static_cast<uint16_t>(a));
        if (internal::Fp8FastScaleOk(Fp8BlockScale(amax))) want += 2 * (a + 1);
      }
      EXPECT_EQ(pairs, want);
    }
  }
}

TEST(Fp8Gpu, LoaderQuantizesShardsOnTheDeviceLikeTheCpu) {
  REQUIRE_GPU();
  auto backend = memory::MakeCudaBackend();
  if (!backend.ok()) GTEST_SKIP() << "no cuda-vmm backend: " << backend.status().message();
  testing::TempDir dir;
  safetensors::LlamaShape shape;
  shape.layers = 2;
  shape.hidden = 512;
  shape.intermediate = 1376;  // 688 per rank: ragged 128-blocks on both splits
  shape.heads = 8;
  shape.kv_heads = 4;
  shape.vocab = 4096;
  ASSERT_TRUE(safetensors::WriteLlamaCheckpoint(dir.path(), shape).ok());
  spec::ModelSpec s;
  s.name = "q";
  s.model_dir = dir.path();
  s.tp_size = 2;
  s.quantization = "fp8_block";
  auto model = OpenModel(s);
  ASSERT_TRUE(model.ok()) << model.status();
  for (int rank : {0, 1}) {
    SCOPED_TRACE(absl::StrCat("rank ", rank));
    spec::Layout layout;
    layout.tp_size = 2;
    layout.tp_rank = rank;
    PlanOptions popts;
    popts.loader_reads_pieces = true;
    popts.alignment = (*backend)->tensor_alignment();
    popts.max_segment_bytes = (*backend)->max_segment_bytes();
    auto plan = PlanRank(**model, layout, popts);
    ASSERT_TRUE(plan.ok()) << plan.status();
    LoadOptions lopts;
    lopts.staging_bytes = 1 << 20;  // small buffers: a shard spans several flushes
    lopts.staging_buffers = 2;
    auto loaded = LoadRank(**model, *plan, **backend, "", "fp8test", lopts, nullptr);
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    // Map the sealed segments read-only and copy every tensor back.
    std::vector<ScopedFd> fds;
    std::vector<uint64_t> sizes;
    for (const auto& seg : (*loaded)->segments) {
      fds.emplace_back(::dup(seg->fd()));
      sizes.push_back(seg->size());
    }
    auto map = memory::MapReadOnly(memory::BackendKind::kCudaVmm, std::move(fds), sizes,
                                   (*loaded)->device_uuid);
    ASSERT_TRUE(map.ok()) << map.status();
    auto device_bytes = [&](const PlannedTensor& t) {
      std::vector<uint8_t> out(t.nbytes);
      EXPECT_TRUE(memory::CopyToHost(memory::BackendKind::kCudaVmm, (*loaded)->device_uuid,
                                     (*map)->base(t.segment) + t.offset, t.nbytes, out.data())
                      .ok());
      return out;
    };
    int quantized = 0;
    for (const auto& t : plan->tensors) {
      if (!t.quant.has_value()) continue;
      ++quantized;
      std::vector<uint8_t> src(t.quant->src_nbytes);
      ASSERT_TRUE(
          ReadPlannedTensor(t, (*model)->checkpoint.files()[t.file_index].fd(), src.data(), t.name)
              .ok());
      const int64_t rows = t.shape[0], cols = t.shape[1];
      std::vector<uint8_t> fp8(static_cast<size_t>(rows * cols));
      std::vector<float> sc(static_cast<size_t>(((rows + 127) / 128) * ((cols + 127) / 128)));
      ASSERT_TRUE(
          QuantizeFp8Block(DType::kBF16, src.data(), rows, cols, 128, 128, fp8.data(), sc.data())
              .ok());
      EXPECT_EQ(device_bytes(t), fp8) << t.name;
      const PlannedTensor* scale = nullptr;
      for (const auto& u : plan->tensors) {
        if (u.name == t.quant->scale) scale = &u;
      }
      ASSERT_NE(scale, nullptr) << t.name;
      std::vector<uint8_t> want(sc.size() * 4);
      std::memcpy(want.data(), sc.data(), want.size());
      EXPECT_EQ(device_bytes(*scale), want) << scale->name;
    }
    EXPECT_EQ(quantized, 2 * 7);  // q k v o gate up down per layer
  }
}

}  // namespace
}  // namespace weightcache::load
