#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "pkg/integrity/segment_digest.h"
#include "pkg/load/fp8_quant.h"
#include "pkg/load/loader.h"
#include "pkg/load/model.h"
#include "pkg/load/pieces.h"
#include "pkg/load/plan.h"
#include "pkg/memory/backend.h"
#include "pkg/safetensors/writer.h"
#include "tests/testutil/temp_dir.h"

namespace weightcache::load {
namespace {

using testing::TempDir;

spec::ModelSpec SpecFor(const std::string& dir) {
  spec::ModelSpec s;
  s.name = "tiny";
  s.model_dir = dir;
  return s;
}

std::string ReadAt(const std::string& path, uint64_t off, uint64_t n) {
  std::string out(n, '\0');
  int fd = ::open(path.c_str(), O_RDONLY);
  EXPECT_GE(fd, 0);
  EXPECT_EQ(::pread(fd, out.data(), n, static_cast<off_t>(off)), static_cast<ssize_t>(n));
  ::close(fd);
  return out;
}

// A backend whose segments are not host-addressable (like GPU memory), so the loader
// takes its staging path; the memory and FDs underneath are real memfds.
class NoHostPointerBackend final : public memory::Backend {
 public:
  class Seg final : public memory::Segment {
   public:
    explicit Seg(std::unique_ptr<memory::Segment> s) : s_(std::move(s)) {}
    uint64_t size() const override { return s_->size(); }
    std::byte* host_data() override { return nullptr; }
    absl::Status CopyIn(uint64_t o, const void* p, size_t n) override {
      copies++;
      return s_->CopyIn(o, p, n);
    }
    absl::Status Seal() override { return s_->Seal(); }
    bool sealed() const override { return s_->sealed(); }
    int fd() const override { return s_->fd(); }
    const std::string& device_uuid() const override { return s_->device_uuid(); }
    int copies = 0;

   private:
    std::unique_ptr<memory::Segment> s_;
  };
  memory::BackendKind kind() const override { return memory::BackendKind::kHost; }
  uint64_t granularity() const override { return host_->granularity(); }
  uint64_t max_segment_bytes() const override { return 8 << 20; }
  std::vector<memory::DeviceInfo> Devices() const override { return host_->Devices(); }
  absl::StatusOr<std::unique_ptr<memory::Segment>> Allocate(const std::string& d, uint64_t n,
                                                            const std::string& l) override {
    auto s = host_->Allocate(d, n, l);
    if (!s.ok()) return s.status();
    return std::unique_ptr<memory::Segment>(new Seg(std::move(s).value()));
  }

 private:
  std::unique_ptr<memory::Backend> host_ = memory::MakeHostBackend();
};

void ExpectBytesEqualFiles(const OpenedModel& m, const LoadedModel& loaded) {
  ASSERT_EQ(loaded.plan.tensors.size(), m.checkpoint.tensors().size());
  for (const auto& t : loaded.plan.tensors) {
    const auto& file = m.checkpoint.files()[t.file_index].info();
    std::string want = ReadAt(file.path, t.file_offset, t.nbytes);
    std::string got(t.nbytes, '\0');
    // Sealed segments: read back through the shared (read-only) descriptor.
    ASSERT_EQ(::pread(loaded.segments[t.segment]->fd(), got.data(), t.nbytes,
                      static_cast<off_t>(t.offset)),
              static_cast<ssize_t>(t.nbytes));
    ASSERT_EQ(got, want) << t.name;
  }
}

TEST(OpenModel, ReadsConfigDtypeAndFingerprintInputs) {
  TempDir dir;
  ASSERT_TRUE(safetensors::WriteLlamaCheckpoint(dir.path(), {}).ok());
  auto m = OpenModel(SpecFor(dir.path()));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ((*m)->architecture, "LlamaForCausalLM");
  EXPECT_EQ((*m)->dtype, "bf16");
  EXPECT_EQ((*m)->quantization.method, "none");
  auto in = (*m)->Inputs({}, {});
  ASSERT_EQ(in.files.size(), 1u);
  EXPECT_EQ(in.files[0].name, "model.safetensors");
  EXPECT_EQ(in.files[0].content.substr(0, 7), "sha256:");
  EXPECT_TRUE((*m)->ChangedFiles().empty());
}

// A base model and its fine-tune: same architecture and shapes, so byte-identical headers,
// different weights. Their identities must differ (the header alone cannot tell them apart).
TEST(OpenModel, IdenticalHeadersDifferentWeightsNeverShareAFingerprint) {
  TempDir a, b;
  safetensors::LlamaShape shape;
  ASSERT_TRUE(safetensors::WriteLlamaCheckpoint(a.path(), shape).ok());
  shape.seed = 43;
  ASSERT_TRUE(safetensors::WriteLlamaCheckpoint(b.path(), shape).ok());
  auto ma = OpenModel(SpecFor(a.path()));
  auto mb = OpenModel(SpecFor(b.path()));
  ASSERT_TRUE(ma.ok() && mb.ok());
  ASSERT_EQ((*ma)->checkpoint.files()[0].info().header_sha256,
            (*mb)->checkpoint.files()[0].info().header_sha256);
  auto ia = (*ma)->Inputs({}, {});
  auto ib = (*mb)->Inputs({}, {});
  EXPECT_NE(ia.Digest(), ib.Digest());
  EXPECT_EQ(spec::FormatDiff(spec::Diff(ia, ib)).substr(0, 40),
            "files[model.safetensors].content: cached");
  // A moved (copied) checkpoint keeps its identity.
  TempDir c;
  std::filesystem::copy(
      a.path(), c.path(),
      std::filesystem::copy_options::recursive | std::filesystem::copy_options::overwrite_existing);
  auto mc = OpenModel(SpecFor(c.path()));
  ASSERT_TRUE(mc.ok());
  EXPECT_EQ((*mc)->Inputs({}, {}).Digest(), ia.Digest());
}

TEST(OpenModel, ChangedFilesNamesTheFileAndTheChange) {
  TempDir dir;
  ASSERT_TRUE(safetensors::WriteLlamaCheckpoint(dir.path(), {}).ok());
  auto m = OpenModel(SpecFor(dir.path()));
  ASSERT_TRUE(m.ok());
  ASSERT_EQ(::truncate((dir / "model.safetensors").c_str(), 100), 0);
  auto changed = (*m)->ChangedFiles();
  ASSERT_EQ(changed.size(), 1u);
  EXPECT_THAT(changed[0], ::testing::StartsWith("model.safetensors: size "));
  EXPECT_THAT(changed[0], ::testing::HasSubstr(" -> 100, modified "));
}

TEST(OpenModel, RefusedQuantizationFailsBeforeAnyWeightIsRead) {
  TempDir dir;
  ASSERT_TRUE(safetensors::WriteLlamaCheckpoint(dir.path(), {}).ok());
  // Corrupt the weights: if the loader opened them, it would fail with INVALID_ARGUMENT.
  { std::ofstream(dir / "model.safetensors", std::ios::trunc) << "garbage"; }
  for (const char* method : {"awq", "gptq", "marlin", "fp8"}) {
    std::ofstream(dir / "config.json", std::ios::trunc)
        << R"({"architectures":["LlamaForCausalLM"],"torch_dtype":"bfloat16",)"
        << R"("quantization_config":{"quant_method":")" << method << R"(","bits":4}})";
    auto m = OpenModel(SpecFor(dir.path()));
    ASSERT_EQ(m.status().code(), absl::StatusCode::kUnimplemented) << method << m.status();
    EXPECT_NE(m.status().message().find(method), absl::string_view::npos) << m.status();
    EXPECT_NE(m.status().message().find("fp8_block"), absl::string_view::npos) << m.status();
  }
}

TEST(OpenModel, DtypeConversionIsRefusedClearly) {
  TempDir dir;
  ASSERT_TRUE(safetensors::WriteLlamaCheckpoint(dir.path(), {}).ok());
  auto s = SpecFor(dir.path());
  s.dtype = "fp16";
  auto m = OpenModel(s);
  EXPECT_EQ(m.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(m.status().message().find("stores bf16"), absl::string_view::npos) << m.status();
}

TEST(PlanRank, PacksAlignedNonOverlappingWithinSegments) {
  TempDir dir;
  ASSERT_TRUE(safetensors::WriteLlamaCheckpoint(dir.path(), {}).ok());
  auto m = OpenModel(SpecFor(dir.path()));
  ASSERT_TRUE(m.ok()) << m.status();
  PlanOptions o{.alignment = 256, .max_segment_bytes = 8 << 20};
  auto plan = PlanRank(**m, {}, o);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_GT(plan->segment_bytes.size(), 1u);
  uint64_t total = 0;
  std::vector<uint64_t> end(plan->segment_bytes.size(), 0);
  for (const auto& t : plan->tensors) {
    EXPECT_EQ(t.offset % 256, 0u) << t.name;
    EXPECT_GE(t.offset, end[t.segment]) << t.name << " overlaps";
    end[t.segment] = t.offset + t.nbytes;
    EXPECT_LE(end[t.segment], plan->segment_bytes[t.segment]);
    if (t.nbytes <= o.max_segment_bytes) {
      EXPECT_LE(end[t.segment], o.max_segment_bytes);
    }
    total += t.nbytes;
    ASSERT_FALSE(t.strides.empty());
    EXPECT_EQ(t.strides.back(), 1);
  }
  EXPECT_EQ(total, plan->total_bytes);
  EXPECT_EQ(total, (*m)->checkpoint.total_bytes());
}

TEST(PlanRank, OtherLayoutsAreRefusedWithTheReason) {
  TempDir dir;
  ASSERT_TRUE(safetensors::WriteLlamaCheckpoint(dir.path(), {}).ok());
  auto m = OpenModel(SpecFor(dir.path()));
  ASSERT_TRUE(m.ok());
  auto plan = PlanRank(**m, {.tp_size = 2, .tp_rank = 1}, {});
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(plan.status().message().find("tp_size 2"), absl::string_view::npos);
}

// A host backend whose new segments hold an earlier owner's bytes (0xA5 everywhere), as
// memory that no one promised to zero would: what the daemon does not write shows.
class DirtyHostBackend final : public memory::Backend {
 public:
  memory::BackendKind kind() const override { return memory::BackendKind::kHost; }
  uint64_t granularity() const override { return host_->granularity(); }
  uint64_t max_segment_bytes() const override { return host_->max_segment_bytes(); }
  std::vector<memory::DeviceInfo> Devices() const override { return host_->Devices(); }
  absl::StatusOr<std::unique_ptr<memory::Segment>> Allocate(const std::string& d, uint64_t n,
                                                            const std::string& l) override {
    auto s = host_->Allocate(d, n, l);
    if (s.ok()) std::memset((*s)->host_data(), 0xA5, (*s)->size());
    return s;
  }

 private:
  std::unique_ptr<memory::Backend> host_ = memory::MakeHostBackend();
};

TEST(LoadRank, TailsZeroGapsAndTailOfEverySegmentAndTheDigestIsOfZeroedGaps) {
  TempDir dir;
  safetensors::LlamaShape shape = safetensors::TinyLlama();
  shape.hidden = 72;  // norms of 144 bytes: 112-byte gaps after them at 256-byte alignment
  shape.shards = 2;
  ASSERT_TRUE(safetensors::WriteLlamaCheckpoint(dir.path(), shape).ok());
  auto m = OpenModel(SpecFor(dir.path()));
  ASSERT_TRUE(m.ok()) << m.status();
  DirtyHostBackend backend;
  auto plan = PlanRank(**m, {}, {.alignment = 256, .max_segment_bytes = 16 << 10});
  ASSERT_TRUE(plan.ok()) << plan.status();
  auto loaded = LoadRank(**m, *plan, backend, "", "tails", {}, nullptr);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ExpectBytesEqualFiles(**m, **loaded);
  auto clean = memory::MakeHostBackend();
  uint64_t gap_bytes = 0, tail_bytes = 0;
  for (size_t i = 0; i < (*loaded)->segments.size(); ++i) {
    const memory::Segment& seg = *(*loaded)->segments[i];
    std::vector<bool> covered(seg.size(), false);
    uint64_t end = 0;
    for (const auto& t : (*loaded)->plan.tensors) {
      if (t.segment != i) continue;
      std::fill(covered.begin() + static_cast<ptrdiff_t>(t.offset),
                covered.begin() + static_cast<ptrdiff_t>(t.offset + t.nbytes), true);
      end = std::max(end, t.offset + t.nbytes);
    }
    std::string got(seg.size(), '\0');
    ASSERT_EQ(::pread(seg.fd(), got.data(), got.size(), 0), static_cast<ssize_t>(got.size()));
    uint64_t nonzero = 0;
    for (uint64_t b = 0; b < seg.size(); ++b) {
      if (covered[b]) continue;
      (b < end ? gap_bytes : tail_bytes)++;
      if (got[b] != '\0') ++nonzero;
    }
    EXPECT_EQ(nonzero, 0u) << "segment " << i << ": bytes no tensor covers are not zero";
    // The same tensor bytes in a fresh (zero-filled) memfd: the digests must agree.
    auto want = clean->Allocate("", seg.size(), "want");
    ASSERT_TRUE(want.ok()) << want.status();
    for (uint64_t b = 0; b < seg.size(); ++b) {
      if (covered[b]) (*want)->host_data()[b] = static_cast<std::byte>(got[b]);
    }
    ASSERT_TRUE((*want)->Seal().ok());
    auto d_got = integrity::DigestSegment(memory::BackendKind::kHost, seg, {},
                                          integrity::Want::kScrubAndCrypto);
    auto d_want = integrity::DigestSegment(memory::BackendKind::kHost, **want, {},
                                           integrity::Want::kScrubAndCrypto);
    ASSERT_TRUE(d_got.ok() && d_want.ok());
    EXPECT_TRUE(*d_got == *d_want) << "segment " << i;
  }
  // The layout has both kinds of uncovered bytes, or the test proves nothing.
  EXPECT_GT(gap_bytes, 0u);
  EXPECT_GT(tail_bytes, 0u);
}

TEST(LoadRank, HostBackendBytesEqualFilesAndProgressCompletes) {
  TempDir dir;
  ASSERT_TRUE(safetensors::WriteLlamaCheckpoint(dir.path(), {.shards = 3}).ok());
  auto m = OpenModel(SpecFor(dir.path()));
  ASSERT_TRUE(m.ok()) << m.status();
  auto backend = memory::MakeHostBackend();
  auto plan = PlanRank(**m, {}, {.alignment = 256, .max_segment_bytes = 16 << 20});
  ASSERT_TRUE(plan.ok());
  LoadProgress progress;
  auto loaded = LoadRank(**m, *plan, *backend, "", "tiny", {}, &progress);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(progress.done(), progress.total());
  EXPECT_EQ(progress.total(), plan->total_bytes);
  for (const auto& s : (*loaded)->segments) EXPECT_TRUE(s->sealed());
  ExpectBytesEqualFiles(**m, **loaded);
}

TEST(LoadRank, StagingPathForNonHostMemoryBytesEqualFiles) {
  TempDir dir;
  ASSERT_TRUE(safetensors::WriteLlamaCheckpoint(dir.path(), {}).ok());
  auto m = OpenModel(SpecFor(dir.path()));
  ASSERT_TRUE(m.ok());
  NoHostPointerBackend backend;
  auto plan = PlanRank(**m, {}, {.alignment = 256, .max_segment_bytes = 8 << 20});
  ASSERT_TRUE(plan.ok());
  LoadProgress progress;
  // A staging buffer smaller than the largest tensor forces split pieces.
  LoadOptions o;
  o.staging_bytes = 1 << 20;
  auto loaded = LoadRank(**m, *plan, backend, "", "tiny", o, &progress);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(progress.done(), plan->total_bytes);
  ExpectBytesEqualFiles(**m, **loaded);
}

// ---- Online fp8_block quantization (spec quantization: fp8_block on a bf16 checkpoint) ----

spec::ModelSpec OnlineSpec(const std::string& dir, int tp, const std::string& layout = "hf") {
  spec::ModelSpec s = SpecFor(dir);
  s.tp_size = tp;
  s.quantization = "fp8_block";
  s.layout = layout;
  return s;
}

std::string SegmentBytes(const LoadedModel& loaded, const PlannedTensor& t) {
  std::string got(t.nbytes, '\0');
  EXPECT_EQ(
      ::pread(loaded.segments[t.segment]->fd(), got.data(), t.nbytes, static_cast<off_t>(t.offset)),
      static_cast<ssize_t>(t.nbytes));
  return got;
}

// Every quantized tensor equals QuantizeFp8Block applied to its original shard (read
// independently through ReadPlannedTensor); every other tensor equals its file bytes.
// Returns the number of quantized tensors.
int ExpectOnlineBytes(const OpenedModel& m, const LoadedModel& loaded) {
  int quantized = 0;
  std::map<std::string, const PlannedTensor*> by_name;
  for (const auto& t : loaded.plan.tensors) by_name[t.name] = &t;
  for (const auto& t : loaded.plan.tensors) {
    if (!t.scale_of.empty()) continue;
    const int fd = m.checkpoint.files()[t.file_index].fd();
    std::string src(SourceBytes(t), '\0');
    EXPECT_TRUE(ReadPlannedTensor(t, fd, src.data(), t.name).ok());
    if (!t.quant.has_value()) {
      EXPECT_EQ(SegmentBytes(loaded, t), src) << t.name;
      continue;
    }
    ++quantized;
    EXPECT_EQ(t.dtype, safetensors::DType::kF8_E4M3) << t.name;
    const int64_t rows = t.shape[0], cols = t.shape[1];
    std::string fp8(static_cast<size_t>(rows * cols), '\0');
    std::vector<float> scale(static_cast<size_t>(((rows + 127) / 128) * ((cols + 127) / 128)));
    EXPECT_TRUE(QuantizeFp8Block(t.quant->src_dtype, src.data(), rows, cols, 128, 128,
                                 reinterpret_cast<uint8_t*>(fp8.data()), scale.data())
                    .ok());
    EXPECT_EQ(SegmentBytes(loaded, t), fp8) << t.name;
    auto it = by_name.find(t.name + "_scale_inv");
    if (it == by_name.end()) {
      ADD_FAILURE() << "no scale for " << t.name;
      continue;
    }
    const PlannedTensor& sc = *it->second;
    EXPECT_EQ(sc.dtype, safetensors::DType::kF32);
    EXPECT_EQ(sc.shape, (std::vector<int64_t>{(rows + 127) / 128, (cols + 127) / 128}));
    EXPECT_EQ(sc.scale_of, t.name);
    EXPECT_EQ(SegmentBytes(loaded, sc),
              std::string(reinterpret_cast<const char*>(scale.data()), scale.size() * 4))
        << sc.name;
  }
  return quantized;
}

TEST(LoadRank, OnlineFp8HostBackendEqualsTheCpuQuantizerOnEachShard) {
  TempDir dir;
  // intermediate 1376: 688 per rank at tp 2, so row and column splits are off 128-blocks
  // (ragged per-shard blocks), and a 3-file checkpoint.
  ASSERT_TRUE(safetensors::WriteLlamaCheckpoint(dir.path(), {.shards = 3}).ok());
  for (int tp : {1, 2}) {
    auto m = OpenModel(OnlineSpec(dir.path(), tp));
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_EQ((*m)->dtype, "fp8_e4m3");
    EXPECT_TRUE((*m)->quantization.online);
    for (int rank = 0; rank < tp; ++rank) {
      SCOPED_TRACE(absl::StrCat("tp ", tp, " rank ", rank));
      auto backend = memory::MakeHostBackend();
      auto plan =
          PlanRank(**m, {tp, rank, 1, 0},
                   {.alignment = 256, .max_segment_bytes = 4 << 20, .loader_reads_pieces = true});
      ASSERT_TRUE(plan.ok()) << plan.status();
      LoadProgress progress;
      LoadOptions o;
      o.read_threads = 3;
      auto loaded = LoadRank(**m, *plan, *backend, "", "q", o, &progress);
      ASSERT_TRUE(loaded.ok()) << loaded.status();
      EXPECT_EQ(progress.done(), progress.total());
      EXPECT_EQ(ExpectOnlineBytes(**m, **loaded), 2 * 7);
    }
  }
}

TEST(LoadRank, OnlineFp8StagingPathEqualsTheCpuQuantizer) {
  TempDir dir;
  ASSERT_TRUE(safetensors::WriteLlamaCheckpoint(dir.path(), {}).ok());
  auto m = OpenModel(OnlineSpec(dir.path(), 2));
  ASSERT_TRUE(m.ok()) << m.status();
  NoHostPointerBackend backend;
  auto plan =
      PlanRank(**m, {2, 1, 1, 0},
               {.alignment = 256, .max_segment_bytes = 8 << 20, .loader_reads_pieces = true});
  ASSERT_TRUE(plan.ok()) << plan.status();
  LoadProgress progress;
  LoadOptions o;
  o.staging_bytes = 1 << 20;
  auto loaded = LoadRank(**m, *plan, backend, "", "q", o, &progress);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(progress.done(), progress.total());
  EXPECT_EQ(ExpectOnlineBytes(**m, **loaded), 2 * 7);
}

TEST(OpenModel, OnlineFp8ChangesTheFingerprint) {
  TempDir dir;
  ASSERT_TRUE(safetensors::WriteLlamaCheckpoint(dir.path(), {}).ok());
  auto plain = OpenModel(SpecFor(dir.path()));
  auto online = OpenModel(OnlineSpec(dir.path(), 1));
  ASSERT_TRUE(plain.ok() && online.ok());
  auto a = (*plain)->Inputs({}, {});
  auto b = (*online)->Inputs({}, {});
  EXPECT_EQ(b.quant_method, "fp8_block");
  EXPECT_EQ(b.dtype, "fp8_e4m3");
  EXPECT_EQ(b.quant_config_sha256, spec::Sha256Hex(spec::OnlineFp8BlockConfig().data(),
                                                   spec::OnlineFp8BlockConfig().size()));
  EXPECT_NE(a.Digest(), b.Digest());
  const std::string diff = spec::FormatDiff(spec::Diff(a, b));
  EXPECT_NE(diff.find("quant_method: cached none, asked fp8_block"), std::string::npos) << diff;
  EXPECT_NE(diff.find("dtype: cached bf16, asked fp8_e4m3"), std::string::npos) << diff;
}

// ---- Part of a plan (PlanSegments: a peer fill's rest, read from disk) ----

std::string WholeSegment(const LoadedModel& loaded, size_t i, uint64_t bytes) {
  std::string got(bytes, '\0');
  EXPECT_EQ(::pread(loaded.segments[i]->fd(), got.data(), bytes, 0), static_cast<ssize_t>(bytes));
  return got;
}

TEST(PlanSegments, APartLoadsTheWholesBytesIntoItsSegmentsAndReadsLess) {
  TempDir dir;
  ASSERT_TRUE(safetensors::WriteLlamaCheckpoint(dir.path(), {.shards = 3}).ok());
  auto m = OpenModel(OnlineSpec(dir.path(), 1));
  ASSERT_TRUE(m.ok()) << m.status();
  // Segments of 64 KiB: a larger weight gets one of its own, and its scale starts the next.
  auto plan =
      PlanRank(**m, {1, 0, 1, 0},
               {.alignment = 256, .max_segment_bytes = 64 << 10, .loader_reads_pieces = true});
  ASSERT_TRUE(plan.ok()) << plan.status();
  const size_t n = plan->segment_bytes.size();
  ASSERT_GT(n, 4u);
  // A quantized weight whose scale sits in another segment.
  std::map<std::string, uint32_t> segment_of;
  for (const auto& t : plan->tensors) segment_of[t.name] = t.segment;
  const PlannedTensor* split = nullptr;
  for (const auto& t : plan->tensors) {
    if (t.quant && segment_of.at(t.quant->scale) != t.segment) {
      split = &t;
      break;
    }
  }
  ASSERT_NE(split, nullptr) << "no weight has its scale in another segment: nothing to widen";
  const uint32_t weight_segment = split->segment;
  const uint32_t scale_segment = segment_of.at(split->quant->scale);

  // A segment no quantization crosses into or out of.
  std::vector<bool> crossed(n, false);
  for (const auto& t : plan->tensors) {
    if (t.quant && segment_of.at(t.quant->scale) != t.segment) {
      crossed[t.segment] = crossed[segment_of.at(t.quant->scale)] = true;
    }
  }
  uint32_t alone = 0;
  while (alone < n && crossed[alone]) ++alone;
  ASSERT_LT(alone, n);

  // Asked for the scale's segment and that one: the weight's comes too (its quantization
  // writes both), and nothing else.
  std::vector<bool> wanted(n, false);
  wanted[scale_segment] = true;
  wanted[alone] = true;
  const PlanPart part = PlanSegments(*plan, wanted);
  std::vector<uint32_t> expected = {weight_segment, scale_segment, alone};
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(part.segments, expected);
  ASSERT_EQ(part.plan.segment_bytes.size(), part.segments.size());
  EXPECT_TRUE(part.plan.views.empty());
  uint64_t total = 0;
  for (const auto& t : part.plan.tensors) {
    ASSERT_LT(t.segment, part.segments.size()) << t.name;
    EXPECT_EQ(segment_of.at(t.name), part.segments[t.segment]) << t.name;
    total += t.nbytes;
  }
  EXPECT_EQ(part.plan.total_bytes, total);

  auto backend = memory::MakeHostBackend();
  auto whole = LoadRank(**m, *plan, *backend, "", "whole", {}, nullptr);
  ASSERT_TRUE(whole.ok()) << whole.status();
  LoadProgress progress;
  auto some = LoadRank(**m, part.plan, *backend, "", "part", {}, &progress);
  ASSERT_TRUE(some.ok()) << some.status();
  EXPECT_EQ(progress.done(), progress.total());
  for (size_t j = 0; j < part.segments.size(); ++j) {
    const uint32_t i = part.segments[j];
    EXPECT_EQ(WholeSegment(**some, j, plan->segment_bytes[i]),
              WholeSegment(**whole, i, plan->segment_bytes[i]))
        << "segment " << i;
  }
  EXPECT_GT((*some)->stats.bytes_read, 0u);
  EXPECT_LT((*some)->stats.bytes_read, (*whole)->stats.bytes_read);
}

// ---- A tensor-parallel group read once (LoadRanks, scatter.h) ----

std::vector<Plan> PlanGroup(const OpenedModel& m, int tp, uint64_t max_segment) {
  std::vector<Plan> plans;
  for (int r = 0; r < tp; ++r) {
    auto p =
        PlanRank(m, {tp, r, 1, 0},
                 {.alignment = 256, .max_segment_bytes = max_segment, .loader_reads_pieces = true});
    EXPECT_TRUE(p.ok()) << p.status();
    plans.push_back(p.ok() ? *p : Plan{});
  }
  return plans;
}

TEST(LoadRanks, HostGroupReadsEachCheckpointByteOnceAndEqualsEachRanksOwnLoad) {
  TempDir dir;
  ASSERT_TRUE(safetensors::WriteLlamaCheckpoint(dir.path(), {.shards = 3}).ok());
  for (int tp : {2, 4}) {
    SCOPED_TRACE(absl::StrCat("tp ", tp));
    spec::ModelSpec s = SpecFor(dir.path());
    s.tp_size = tp;
    auto m = OpenModel(s);
    ASSERT_TRUE(m.ok()) << m.status();
    uint64_t file_bytes = 0;
    for (const auto& t : (*m)->checkpoint.tensors()) file_bytes += t.nbytes;
    auto backend = memory::MakeHostBackend();
    LoadProgress progress;
    LoadOptions o;
    o.read_threads = 3;
    o.staging_bytes = 2 << 20;  // several buffers: rows and tensors cut between them
    const std::vector<Plan> plans = PlanGroup(**m, tp, 4 << 20);
    auto group = LoadRanks(**m, plans, *backend, std::vector<std::string>(tp),
                           std::vector<std::string>(tp, "g"), o, &progress);
    ASSERT_TRUE(group.ok()) << group.status();
    ASSERT_EQ(group->size(), static_cast<size_t>(tp));
    // Read once: the bytes of the checkpoint's tensors, not tp times the replicated ones.
    EXPECT_EQ((*group)[0]->stats.bytes_read, file_bytes);
    EXPECT_EQ(progress.done(), file_bytes);
    uint64_t separate = 0;
    for (int r = 0; r < tp; ++r) {
      auto own = LoadRank(**m, plans[static_cast<size_t>(r)], *backend, "", "own", o, nullptr);
      ASSERT_TRUE(own.ok()) << own.status();
      separate += (*own)->stats.bytes_read;
      const LoadedModel& g = *(*group)[static_cast<size_t>(r)];
      for (const auto& s : g.segments) EXPECT_TRUE(s->sealed());
      for (const auto& t : g.plan.tensors) {
        std::string want(t.nbytes, '\0');
        ASSERT_TRUE(
            ReadPlannedTensor(t, (*m)->checkpoint.files()[t.file_index].fd(), want.data(), t.name)
                .ok());
        EXPECT_EQ(SegmentBytes(g, t), want) << t.name << " of rank " << r;
        EXPECT_EQ(SegmentBytes(**own, t), want) << t.name << " of rank " << r << " alone";
      }
    }
    EXPECT_GT(separate, file_bytes) << "rank by rank reads the replicated tensors tp times";
  }
}

TEST(LoadRanks, OnlineFp8GroupEqualsTheCpuQuantizerOnEachShardOnBothHostRoutes) {
  TempDir dir;
  ASSERT_TRUE(safetensors::WriteLlamaCheckpoint(dir.path(), {.shards = 2}).ok());
  auto m = OpenModel(OnlineSpec(dir.path(), 2));
  ASSERT_TRUE(m.ok()) << m.status();
  auto host = memory::MakeHostBackend();
  NoHostPointerBackend staged;
  for (memory::Backend* backend : {host.get(), static_cast<memory::Backend*>(&staged)}) {
    LoadOptions o;
    o.staging_bytes = 1 << 20;
    auto group =
        LoadRanks(**m, PlanGroup(**m, 2, 8 << 20), *backend, {"", ""}, {"q", "q"}, o, nullptr);
    ASSERT_TRUE(group.ok()) << group.status();
    for (const auto& rank : *group) EXPECT_EQ(ExpectOnlineBytes(**m, *rank), 2 * 7);
  }
}

TEST(LoadRanks, MismatchedArgumentsAreNamed) {
  TempDir dir;
  ASSERT_TRUE(safetensors::WriteLlamaCheckpoint(dir.path(), {}).ok());
  spec::ModelSpec s = SpecFor(dir.path());
  s.tp_size = 2;
  auto m = OpenModel(s);
  ASSERT_TRUE(m.ok());
  auto backend = memory::MakeHostBackend();
  auto r = LoadRanks(**m, PlanGroup(**m, 2, 4 << 20), *backend, {""}, {"a", "b"}, {}, nullptr);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("2 plans, 1 devices"), absl::string_view::npos);
}

}  // namespace
}  // namespace weightcache::load
