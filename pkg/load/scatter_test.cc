// The scatter plan (read once for a tensor-parallel group, 2-D copies out): for every
// preset, tp 2/4/8 and engine layout, the host executor's bytes in every rank equal what the
// per-rank host path reads (ReadPlannedTensor), each checkpoint byte is read once, and a
// row-parallel shard is one copy per piece, not one per row.
#include "pkg/load/scatter.h"

#include <fcntl.h>
#include <unistd.h>

#include <map>
#include <numeric>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "pkg/load/loader.h"
#include "pkg/load/model.h"
#include "pkg/load/pieces.h"
#include "pkg/load/plan.h"
#include "pkg/memory/backend.h"
#include "pkg/safetensors/writer.h"
#include "tests/testutil/temp_dir.h"

namespace weightcache::load {
namespace {

using safetensors::ArchShape;
using testing::TempDir;

std::shared_ptr<const OpenedModel> Open(const std::string& dir, int tp, const std::string& layout,
                                        const std::string& quantization = "") {
  spec::ModelSpec s;
  s.name = "m";
  s.model_dir = dir;
  s.tp_size = tp;
  s.layout = layout;
  if (!quantization.empty()) s.quantization = quantization;
  auto m = OpenModel(s);
  EXPECT_TRUE(m.ok()) << m.status();
  return m.ok() ? *m : nullptr;
}

std::vector<Plan> PlanRanks(const OpenedModel& m, int tp, const std::vector<int>& ranks) {
  std::vector<Plan> out;
  for (int r : ranks) {
    auto p =
        PlanRank(m, {tp, r, 1, 0},
                 {.alignment = 256, .max_segment_bytes = 1 << 20, .loader_reads_pieces = true});
    EXPECT_TRUE(p.ok()) << p.status();
    out.push_back(p.ok() ? *p : Plan{});
  }
  return out;
}

// One copy per (rank, piece) when no buffer boundary cuts a piece.
uint64_t Items(const std::vector<Plan>& plans) {
  uint64_t n = 0;
  for (const auto& p : plans) {
    for (const auto& t : p.tensors) {
      if (!t.scale_of.empty() || SourceBytes(t) == 0) continue;
      if (t.pieces.empty()) {
        ++n;
        continue;
      }
      for (const auto& piece : t.pieces) n += piece.bytes() > 0 ? 1 : 0;
    }
  }
  return n;
}

// Runs the plan on the host executor into fresh host segments and compares every tensor of
// every rank with the per-rank host path. Returns the bytes the executor read.
uint64_t ExpectScatterEqualsHostPath(const OpenedModel& m, const std::vector<Plan>& plans,
                                     const ScatterOptions& sopts, bool expect_one_copy_per_piece) {
  std::vector<const Plan*> ptrs;
  for (const auto& p : plans) ptrs.push_back(&p);
  auto sp = PlanScatter(ptrs, sopts);
  EXPECT_TRUE(sp.ok()) << sp.status();
  if (!sp.ok()) return 0;
  uint64_t copies = 0;
  for (const auto& b : sp->buffers) {
    copies += b.copies.size();
    for (const auto& c : b.copies) {
      EXPECT_LE(c.src + (c.height - 1) * c.src_pitch + c.width, sp->buffer_bytes);
    }
    for (const auto& s : b.spans) EXPECT_EQ(s.at % sp->align, s.file_offset % sp->align);
  }
  if (expect_one_copy_per_piece && sp->buffers.size() == 1) {
    EXPECT_EQ(copies, Items(plans));
  }
  auto backend = memory::MakeHostBackend();
  std::vector<std::vector<std::unique_ptr<memory::Segment>>> owned(plans.size());
  std::vector<std::vector<memory::Segment*>> segs(plans.size());
  for (size_t r = 0; r < plans.size(); ++r) {
    for (uint64_t bytes : plans[r].segment_bytes) {
      auto s = backend->Allocate("", std::max<uint64_t>(bytes, 1), "t");
      EXPECT_TRUE(s.ok());
      segs[r].push_back(s->get());
      owned[r].push_back(std::move(*s));
    }
  }
  std::vector<ScatterFile> files;
  for (const auto& f : m.checkpoint.files()) {
    files.push_back({f.fd(), -1, f.info().size, f.info().name});
  }
  LoadOptions lo;
  lo.read_threads = 3;
  LoadStats stats;
  LoadProgress progress;
  EXPECT_TRUE(ScatterOnHost(*sp, files, segs, lo, &progress, &stats).ok());
  EXPECT_EQ(stats.bytes_read, sp->read_bytes);
  EXPECT_EQ(progress.done(), progress.total());
  for (size_t r = 0; r < plans.size(); ++r) {
    for (const auto& t : plans[r].tensors) {
      if (!t.scale_of.empty() || t.quant.has_value()) continue;  // fp8: load_test
      std::string want(t.nbytes, '\0');
      const int fd = m.checkpoint.files()[t.file_index].fd();
      EXPECT_TRUE(ReadPlannedTensor(t, fd, want.data(), t.name).ok());
      std::string got(reinterpret_cast<const char*>(segs[r][t.segment]->host_data()) + t.offset,
                      t.nbytes);
      EXPECT_TRUE(got == want) << t.name << " of rank " << r;
    }
  }
  return sp->read_bytes;
}

uint64_t CheckpointBytes(const OpenedModel& m) {
  uint64_t n = 0;
  for (const auto& t : m.checkpoint.tensors()) n += t.nbytes;
  return n;
}

// One test per preset and dtype (issue 24: as one test it took 40 s in the optimized build
// on a busy machine and passed ctest's 120 s timeout under ASan there).
class PlanScatterPreset : public ::testing::TestWithParam<std::tuple<const char*, bool>> {};

TEST_P(PlanScatterPreset, SplitBytesEqualTheHostPathAndReadOnce) {
  const char* arch = std::get<0>(GetParam());
  const bool fp8 = std::get<1>(GetParam());
  {
    {
      ArchShape s;
      s.architecture = arch;
      if (std::string(arch) == "Qwen2ForCausalLM") s.kv_heads = 2;  // replicated at tp 4, 8
      if (std::string(arch) == "DeepseekV3ForCausalLM") {
        s.layers = 3;
        s.mtp = true;
      }
      s.fp8 = fp8;
      s.block = 16;
      s.shards = 3;
      TempDir dir;
      ASSERT_TRUE(safetensors::WriteArchCheckpoint(dir.path(), s).ok());
      for (const char* layout : {"hf", "sglang"}) {
        for (int tp : {2, 4, 8}) {
          SCOPED_TRACE(absl::StrCat(arch, fp8 ? " fp8" : " bf16", " ", layout, " tp ", tp));
          auto m = Open(dir.path(), tp, layout);
          ASSERT_NE(m, nullptr);
          std::vector<int> all(static_cast<size_t>(tp));
          std::iota(all.begin(), all.end(), 0);
          const auto plans = PlanRanks(*m, tp, all);
          // One buffer for everything: one copy per piece; then buffers of 8 KiB, which cut
          // rows and tensors everywhere.
          EXPECT_EQ(ExpectScatterEqualsHostPath(*m, plans, {.buffer_bytes = 256ull << 20}, true),
                    CheckpointBytes(*m));
          EXPECT_EQ(ExpectScatterEqualsHostPath(*m, plans, {.buffer_bytes = 8 << 10}, false),
                    CheckpointBytes(*m));
          if (HasFatalFailure()) return;
        }
      }
    }
  }
}

// A pinned load's buffers take files in turn (issue 58: each file is hashed as it is read, one
// core per file, so files read one after another were hashed one after another): with
// interleave_files = 2 the first buffers alternate between two files, each file's buffers
// keep their order, and every byte still lands where the host path puts it, read once.
// Online quantization keeps file order (one scratch per rank, jobs in order).
TEST(PlanScatter, ParallelDigestPinnedLoadsReadFilesSideBySide) {
  ArchShape s;
  s.architecture = "LlamaForCausalLM";
  s.shards = 3;
  TempDir dir;
  ASSERT_TRUE(safetensors::WriteArchCheckpoint(dir.path(), s).ok());
  auto m = Open(dir.path(), 2, "hf");
  ASSERT_NE(m, nullptr);
  ASSERT_GE(m->checkpoint.files().size(), 3u);
  const auto plans = PlanRanks(*m, 2, {0, 1});
  std::vector<const Plan*> ptrs = {&plans[0], &plans[1]};
  auto in_order = PlanScatter(ptrs, {.buffer_bytes = 8 << 10});
  auto side = PlanScatter(ptrs, {.buffer_bytes = 8 << 10, .interleave_files = 2});
  ASSERT_TRUE(in_order.ok() && side.ok());
  ASSERT_EQ(side->buffers.size(), in_order->buffers.size());
  EXPECT_EQ(side->read_bytes, in_order->read_bytes);
  std::vector<size_t> first_files;
  for (const auto& b : side->buffers) first_files.push_back(b.spans.front().file);
  ASSERT_GE(first_files.size(), 4u);
  EXPECT_NE(first_files[0], first_files[1]) << "the first two buffers are of one file";
  EXPECT_EQ(first_files[0], first_files[2]);
  // Each file's buffers in their order: the same sequence as file order, filtered by file.
  for (size_t f = 0; f < m->checkpoint.files().size(); ++f) {
    std::vector<uint64_t> a, b;
    for (const auto& buf : in_order->buffers)
      if (buf.spans.front().file == f) a.push_back(buf.spans.front().file_offset);
    for (const auto& buf : side->buffers)
      if (buf.spans.front().file == f) b.push_back(buf.spans.front().file_offset);
    EXPECT_EQ(a, b) << "file " << f;
  }
  EXPECT_EQ(ExpectScatterEqualsHostPath(*m, plans, {.buffer_bytes = 8 << 10, .interleave_files = 2},
                                        false),
            CheckpointBytes(*m));
  // fp8 online quantization: file order kept.
  auto q = Open(dir.path(), 2, "hf", "fp8_block");
  ASSERT_NE(q, nullptr);
  const auto qplans = PlanRanks(*q, 2, {0, 1});
  auto qa = PlanScatter({&qplans[0], &qplans[1]}, {.buffer_bytes = 8 << 10});
  auto qb = PlanScatter({&qplans[0], &qplans[1]}, {.buffer_bytes = 8 << 10, .interleave_files = 2});
  ASSERT_TRUE(qa.ok() && qb.ok());
  ASSERT_FALSE(qa->jobs.empty());
  EXPECT_TRUE(qa->buffers == qb->buffers);
}

INSTANTIATE_TEST_SUITE_P(
    EveryPreset, PlanScatterPreset,
    ::testing::Combine(::testing::Values("LlamaForCausalLM", "Qwen2ForCausalLM",
                                         "Qwen3MoeForCausalLM", "MixtralForCausalLM",
                                         "DeepseekV3ForCausalLM"),
                       ::testing::Bool()),
    [](const auto& info) {
      return std::string(std::get<0>(info.param)) + (std::get<1>(info.param) ? "_fp8" : "_bf16");
    });

TEST(PlanScatter, RowParallelShardsAreOneTwoDimensionalCopyPerRank) {
  TempDir dir;
  ASSERT_TRUE(safetensors::WriteLlamaCheckpoint(dir.path(), {}).ok());
  auto m = Open(dir.path(), 4, "hf");
  ASSERT_NE(m, nullptr);
  const auto plans = PlanRanks(*m, 4, {0, 1, 2, 3});
  std::vector<const Plan*> ptrs;
  for (const auto& p : plans) ptrs.push_back(&p);
  auto sp = PlanScatter(ptrs, {.buffer_bytes = 256ull << 20});
  ASSERT_TRUE(sp.ok()) << sp.status();
  ASSERT_EQ(sp->buffers.size(), 1u);
  // o_proj of layer 0: [hidden, hidden] split along dim 1 -> per rank one copy of `hidden`
  // rows, a quarter row wide, a whole row apart.
  const PlannedTensor* o = nullptr;
  for (const auto& t : plans[2].tensors) {
    if (t.name == "model.layers.0.self_attn.o_proj.weight") o = &t;
  }
  ASSERT_NE(o, nullptr);
  const uint64_t row = static_cast<uint64_t>(o->shape[1]) * 2;  // bf16, the shard's row
  int found = 0;
  for (const auto& c : sp->buffers[0].copies) {
    if (c.rank != 2 || c.segment != o->segment || c.dst != o->offset) continue;
    ++found;
    EXPECT_EQ(c.height, static_cast<uint64_t>(o->shape[0]));
    EXPECT_EQ(c.width, row);
    EXPECT_EQ(c.src_pitch, 4 * row);
  }
  EXPECT_EQ(found, 1);
}

TEST(PlanScatter, ASubsetOfRanksReadsOnlyWhatItNeeds) {
  TempDir dir;
  ASSERT_TRUE(safetensors::WriteLlamaCheckpoint(dir.path(), {.shards = 2}).ok());
  auto m = Open(dir.path(), 4, "hf");
  ASSERT_NE(m, nullptr);
  const auto plans = PlanRanks(*m, 4, {1, 3});
  const uint64_t read = ExpectScatterEqualsHostPath(*m, plans, {.buffer_bytes = 1 << 20}, false);
  EXPECT_LT(read, CheckpointBytes(*m));
  // Rows of 64 KiB or more are read one by one: only the needed bytes.
  const uint64_t rows_read = ExpectScatterEqualsHostPath(
      *m, plans, {.buffer_bytes = 1 << 20, .read_rows_above = 1}, false);
  EXPECT_LE(rows_read, read);
}

}  // namespace
}  // namespace weightcache::load
