// Tensor-parallel planning: for every preset, a generated checkpoint with the architecture's
// real tensor names is planned for tp 1, 2, 4 and 8 under each engine layout; every rank's
// shard is read through its pieces and compared with the slice the engines expect (derived
// here independently of the preset table), and the union of the shards must rebuild every
// original tensor byte for byte.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <map>
#include <set>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "pkg/load/loader.h"
#include "pkg/load/model.h"
#include "pkg/load/pieces.h"
#include "pkg/load/plan.h"
#include "pkg/load/shard_rules.h"
#include "pkg/memory/backend.h"
#include "pkg/safetensors/writer.h"
#include "tests/testutil/temp_dir.h"

namespace weightcache::load {
namespace {

using safetensors::ArchShape;
using safetensors::DType;
using ::testing::HasSubstr;
using testing::TempDir;

std::string Msg(const absl::Status& s) { return std::string(s.message()); }

bool Has(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}
bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

absl::StatusOr<std::shared_ptr<const OpenedModel>> Open(const std::string& dir, int tp = 1,
                                                        const std::string& layout = "hf") {
  spec::ModelSpec s;
  s.name = "m";
  s.model_dir = dir;
  s.tp_size = tp;
  s.layout = layout;
  return OpenModel(s);
}

std::vector<uint8_t> ReadOriginal(const OpenedModel& m, const safetensors::TensorInfo& t) {
  std::vector<uint8_t> out(t.nbytes);
  const int fd = m.checkpoint.files()[t.file_index].fd();
  EXPECT_EQ(::pread(fd, out.data(), t.nbytes, static_cast<off_t>(t.file_offset)),
            static_cast<ssize_t>(t.nbytes));
  return out;
}

std::vector<uint8_t> ReadShard(const OpenedModel& m, const PlannedTensor& t,
                               uint64_t gather_below = 64 << 10) {
  std::vector<uint8_t> out(t.nbytes, 0xAB);  // not zero: padding must be written
  auto s = ReadPlannedTensor(t, m.checkpoint.files()[t.file_index].fd(), out.data(), t.name, {},
                             gather_below);
  EXPECT_TRUE(s.ok()) << s;
  return out;
}

// ---- What an engine's rank holds, written out per tensor name (not from shard_rules) ----

enum class Kind { kReplicated, kColumn, kRow, kVocab };

struct Expected {
  Kind kind = Kind::kReplicated;
  int64_t parts = 1;
  int64_t index = 0;
};

Expected ExpectedSplit(std::string name, int tp, int rank, int kv_heads) {
  if (EndsWith(name, ".weight_scale_inv")) {
    name = name.substr(0, name.size() - 17) + ".weight";
  }
  const bool replicated = EndsWith(name, "norm.weight") || EndsWith(name, "layernorm.weight") ||
                          EndsWith(name, "mlp.gate.weight") ||
                          EndsWith(name, "block_sparse_moe.gate.weight") ||
                          EndsWith(name, "e_score_correction_bias") || Has(name, ".q_a_proj.") ||
                          Has(name, ".kv_a_proj_with_mqa.") || EndsWith(name, "eh_proj.weight");
  if (replicated) return {Kind::kReplicated, 1, 0};
  if (EndsWith(name, "embed_tokens.weight") || name == "lm_head.weight" ||
      EndsWith(name, "shared_head.head.weight")) {
    return {Kind::kVocab, tp, rank};
  }
  if (EndsWith(name, "o_proj.weight") || EndsWith(name, "down_proj.weight") ||
      EndsWith(name, ".w2.weight")) {
    return {Kind::kRow, tp, rank};
  }
  if ((Has(name, ".k_proj.") || Has(name, ".v_proj.")) && kv_heads < tp) {
    // GQA replication as vLLM/SGLang: tp/kv consecutive ranks share one k/v head.
    return {Kind::kColumn, kv_heads, rank / (tp / kv_heads)};
  }
  return {Kind::kColumn, tp, rank};
}

// Row-major helpers over raw bytes.
std::vector<uint8_t> Rows(const std::vector<uint8_t>& b, const std::vector<int64_t>& shape,
                          int64_t lo, int64_t hi) {
  const uint64_t row = b.size() / static_cast<uint64_t>(shape[0]);
  return {b.begin() + static_cast<int64_t>(lo * row), b.begin() + static_cast<int64_t>(hi * row)};
}

std::vector<uint8_t> Cols(const std::vector<uint8_t>& b, const std::vector<int64_t>& shape,
                          size_t elem, int64_t lo, int64_t hi) {
  std::vector<uint8_t> out;
  for (int64_t r = 0; r < shape[0]; ++r) {
    const auto* row = b.data() + r * shape[1] * elem;
    out.insert(out.end(), row + lo * elem, row + hi * elem);
  }
  return out;
}

struct Case {
  ArchShape shape;
  std::string layout = "hf";
};

// Plans every rank of `tp`, checks each shard against the engine's expected slice and shape,
// rebuilds every tensor from the shards and compares it with the original.
void CheckAllRanks(const OpenedModel& m, const ArchShape& shape, int tp,
                   const std::string& layout) {
  SCOPED_TRACE(absl::StrCat(shape.architecture, " tp ", tp, " layout ", layout));
  const int kv = shape.architecture == "DeepseekV3ForCausalLM" ? shape.heads : shape.kv_heads;
  const int64_t pad = layout == "hf" ? 1 : 64;
  const int64_t block = shape.block;
  std::map<std::string, std::vector<uint8_t>> rebuilt;
  std::map<std::string, const safetensors::TensorInfo*> originals;
  for (const auto& t : m.checkpoint.tensors()) {
    originals[t.name] = &t;
    rebuilt[t.name].assign(t.nbytes, 0xCD);
  }
  PlanOptions opts;
  opts.loader_reads_pieces = true;
  for (int rank = 0; rank < tp; ++rank) {
    auto plan = PlanRank(m, {tp, rank, 1, 0}, opts);
    ASSERT_TRUE(plan.ok()) << plan.status();
    ASSERT_EQ(plan->tensors.size(), m.checkpoint.tensors().size());
    for (const auto& p : plan->tensors) {
      SCOPED_TRACE(absl::StrCat(p.name, " rank ", rank));
      const auto& o = *originals.at(p.name);
      const std::vector<uint8_t> orig = ReadOriginal(m, o);
      const std::vector<uint8_t> shard = ReadShard(m, p);
      ASSERT_EQ(p.dtype, o.dtype);
      const size_t elem = safetensors::DTypeSize(o.dtype);
      const bool scale = EndsWith(p.name, "_scale_inv");
      const Expected e = ExpectedSplit(p.name, tp, rank, kv);
      std::vector<int64_t> want_shape = o.shape;
      std::vector<uint8_t> want;
      auto& out = rebuilt[p.name];
      switch (e.kind) {
        case Kind::kReplicated:
          want = orig;
          out = shard;
          break;
        case Kind::kVocab: {
          const int64_t padded = (o.shape[0] + pad - 1) / pad * pad;
          const int64_t per = padded / tp;
          const int64_t lo = std::min(o.shape[0], rank * per);
          const int64_t hi = std::min(o.shape[0], (rank + 1) * per);
          want_shape[0] = per;
          want = Rows(orig, o.shape, lo, hi);
          want.resize(static_cast<size_t>(per) * (orig.size() / o.shape[0]), 0);  // zero rows
          std::copy(shard.begin(),
                    shard.begin() + static_cast<int64_t>((hi - lo) * (orig.size() / o.shape[0])),
                    out.begin() + static_cast<int64_t>(lo * (orig.size() / o.shape[0])));
          break;
        }
        case Kind::kColumn:
        case Kind::kRow: {
          const int d = e.kind == Kind::kColumn ? 0 : 1;
          int64_t lo, hi;
          if (scale) {  // the weight's split, in blocks
            const auto& w = *originals.at(p.name.substr(0, p.name.size() - 17) + ".weight");
            const int64_t per = w.shape[d] / e.parts;
            lo = e.index * per / block;
            hi = e.index + 1 == e.parts ? o.shape[d] : (e.index + 1) * per / block;
          } else {
            const int64_t per = o.shape[d] / e.parts;
            lo = e.index * per;
            hi = lo + per;
          }
          want_shape[d] = hi - lo;
          if (d == 0) {
            want = Rows(orig, o.shape, lo, hi);
            std::copy(shard.begin(), shard.end(),
                      out.begin() + static_cast<int64_t>(lo * (orig.size() / o.shape[0])));
          } else {
            want = Cols(orig, o.shape, elem, lo, hi);
            for (int64_t r = 0; r < o.shape[0]; ++r) {
              std::memcpy(out.data() + (r * o.shape[1] + lo) * elem,
                          shard.data() + r * (hi - lo) * elem, (hi - lo) * elem);
            }
          }
          break;
        }
      }
      ASSERT_EQ(p.shape, want_shape);
      ASSERT_EQ(p.nbytes, want.size());
      ASSERT_TRUE(shard == want) << "shard bytes differ from the engine's slice";
      std::vector<int64_t> strides(p.shape.size(), 1);
      for (size_t i = p.shape.size(); i-- > 1;) strides[i - 1] = strides[i] * p.shape[i];
      ASSERT_EQ(p.strides, strides);
    }
    // Tensors are disjoint, aligned where they start a placement unit, inside their segment.
    std::vector<std::tuple<uint32_t, uint64_t, uint64_t>> spans;
    for (const auto& p : plan->tensors) {
      ASSERT_LT(p.segment, plan->segment_bytes.size());
      ASSERT_LE(p.offset + p.nbytes, plan->segment_bytes[p.segment]) << p.name;
      spans.emplace_back(p.segment, p.offset, p.offset + p.nbytes);
    }
    std::sort(spans.begin(), spans.end());
    for (size_t i = 1; i < spans.size(); ++i) {
      if (std::get<0>(spans[i]) == std::get<0>(spans[i - 1])) {
        ASSERT_LE(std::get<2>(spans[i - 1]), std::get<1>(spans[i]));
      }
    }
  }
  for (const auto& t : m.checkpoint.tensors()) {
    ASSERT_TRUE(rebuilt[t.name] == ReadOriginal(m, t)) << t.name << " not rebuilt by the shards";
  }
}

std::vector<ArchShape> AllPresets(bool fp8) {
  std::vector<ArchShape> out;
  for (const char* arch : {"LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM",
                           "Qwen3MoeForCausalLM", "MixtralForCausalLM", "DeepseekV3ForCausalLM"}) {
    ArchShape s;
    s.architecture = arch;
    if (std::string(arch) == "Qwen2ForCausalLM") s.kv_heads = 2;  // replicated at tp 4 and 8
    if (std::string(arch) == "DeepseekV3ForCausalLM") {
      s.layers = 3;  // one dense layer, two MoE layers, and the MTP layer
      s.mtp = true;
    }
    s.fp8 = fp8;
    s.block = 16;  // small blocks: tp 8 splits stay on block boundaries at test sizes
    s.shards = 3;
    out.push_back(s);
  }
  return out;
}

class EveryPreset : public ::testing::TestWithParam<bool> {};

TEST_P(EveryPreset, ShardsRebuildEveryTensorForTp1248InEveryLayout) {
  for (const ArchShape& shape : AllPresets(GetParam())) {
    TempDir dir;
    ASSERT_TRUE(safetensors::WriteArchCheckpoint(dir.path(), shape).ok());
    for (const char* layout : {"hf", "sglang", "vllm"}) {
      auto m = Open(dir.path(), 1, layout);
      ASSERT_TRUE(m.ok()) << m.status();
      ASSERT_EQ((*m)->architecture, shape.architecture);
      for (int tp : {1, 2, 4, 8}) {
        CheckAllRanks(**m, shape, tp, layout);
        if (HasFatalFailure()) return;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Bf16AndBlockFp8, EveryPreset, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "fp8" : "bf16"; });

// Blocks that do not divide the dimensions: through the preset at tp 1 (sglang layout), the
// column-parallel scales keep their ragged last block; fused scale views need every member
// but the last to be whole blocks (as vLLM and SGLang require), else a named error.
TEST(PlanRank, Fp8RaggedScaleGrids) {
  TempDir dir;
  ArchShape s;
  s.architecture = "DeepseekV3ForCausalLM";
  s.fp8 = true;
  s.block = 64;
  s.qk_nope_head_dim = 20;  // q_b_proj: 8 x 36 = 288 rows = 4.5 blocks
  s.qk_rope_head_dim = 16;  // kv_a_proj_with_mqa: 128 + 16 = 144 rows = 2.25 blocks
  ASSERT_TRUE(safetensors::WriteArchCheckpoint(dir.path(), s).ok());
  auto m = Open(dir.path(), 1, "sglang");
  ASSERT_TRUE(m.ok()) << m.status();
  const auto* scale = (*m)->checkpoint.Find("model.layers.0.self_attn.q_b_proj.weight_scale_inv");
  ASSERT_NE(scale, nullptr);
  EXPECT_EQ(scale->shape, (std::vector<int64_t>{5, 2}));  // [ceil(288/64), ceil(128/64)]
  CheckAllRanks(**m, s, 1, "sglang");
  if (HasFatalFailure()) return;
  // tp 2 must refuse: 288 / 2 = 144 rows is not a multiple of 64.
  auto plan = PlanRank(**m, {2, 0, 1, 0}, {256, 1ull << 30, true});
  ASSERT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(plan.status()), HasSubstr("-element weight block boundary"));

  TempDir dir48;
  s.block = 48;  // gate_proj: 512 rows, not whole blocks, ahead of up_proj in gate_up_proj
  ASSERT_TRUE(safetensors::WriteArchCheckpoint(dir48.path(), s).ok());
  auto m48 = Open(dir48.path(), 1, "sglang");
  ASSERT_TRUE(m48.ok()) << m48.status();
  plan = PlanRank(**m48, {1, 0, 1, 0}, {256, 1ull << 30, true});
  ASSERT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(plan.status()),
              HasSubstr("model 'm': fused view 'model.layers.0.mlp.gate_up_proj.weight_scale_inv':"
                        " member 'model.layers.0.mlp.gate_proj.weight' has 512 rows on this rank,"
                        " not a multiple of the 48-row weight block"));
  auto hf = Open(dir48.path(), 1, "hf");
  ASSERT_TRUE(hf.ok());
  EXPECT_TRUE(PlanRank(**hf, {1, 0, 1, 0}, {}).ok()) << "hf has no fused views";
}

// ---- Shapes engines expect, by hand ----

TEST(PlanRank, LlamaShardShapesOnRank2OfTp4) {
  TempDir dir;
  ArchShape s;  // hidden 256, 8 heads of 32, 4 kv heads, intermediate 512, vocab 1000
  ASSERT_TRUE(safetensors::WriteArchCheckpoint(dir.path(), s).ok());
  auto m = Open(dir.path());
  ASSERT_TRUE(m.ok()) << m.status();
  PlanOptions opts;
  opts.loader_reads_pieces = true;
  auto plan = PlanRank(**m, {4, 2, 1, 0}, opts);
  ASSERT_TRUE(plan.ok()) << plan.status();
  std::map<std::string, const PlannedTensor*> by;
  for (const auto& t : plan->tensors) by[t.name] = &t;
  const std::string l = "model.layers.1.";
  EXPECT_EQ(by.at(l + "self_attn.q_proj.weight")->shape, (std::vector<int64_t>{64, 256}));
  EXPECT_EQ(by.at(l + "self_attn.k_proj.weight")->shape, (std::vector<int64_t>{32, 256}));
  EXPECT_EQ(by.at(l + "self_attn.o_proj.weight")->shape, (std::vector<int64_t>{256, 64}));
  EXPECT_EQ(by.at(l + "mlp.gate_proj.weight")->shape, (std::vector<int64_t>{128, 256}));
  EXPECT_EQ(by.at(l + "mlp.down_proj.weight")->shape, (std::vector<int64_t>{256, 128}));
  EXPECT_EQ(by.at(l + "input_layernorm.weight")->shape, (std::vector<int64_t>{256}));
  EXPECT_EQ(by.at("model.embed_tokens.weight")->shape, (std::vector<int64_t>{250, 256}));
  // Column shards are one contiguous range: no pieces; rows 2*64.. of q_proj.
  const auto* q = by.at(l + "self_attn.q_proj.weight");
  EXPECT_TRUE(q->pieces.empty());
  const auto* q_orig = (*m)->checkpoint.Find(l + "self_attn.q_proj.weight");
  EXPECT_EQ(q->file_offset, q_orig->file_offset + 2 * 64 * 256 * 2);
  // Row shards are one strided piece: 256 rows of 64 elements, 512 bytes apart.
  const auto* o = by.at(l + "self_attn.o_proj.weight");
  const auto* o_orig = (*m)->checkpoint.Find(l + "self_attn.o_proj.weight");
  ASSERT_EQ(o->pieces.size(), 1u);
  EXPECT_EQ(o->pieces[0], (Piece{o_orig->file_offset + 2 * 64 * 2, 0, 128, 256, 512}));
}

TEST(PlanRank, GqaKvHeadsReplicatedWhenFewerThanRanks) {
  TempDir dir;
  ArchShape s;
  s.kv_heads = 2;  // 8 ranks: ranks 0-3 hold kv head 0, ranks 4-7 kv head 1
  ASSERT_TRUE(safetensors::WriteArchCheckpoint(dir.path(), s).ok());
  auto m = Open(dir.path());
  ASSERT_TRUE(m.ok()) << m.status();
  const auto* k = (*m)->checkpoint.Find("model.layers.0.self_attn.k_proj.weight");
  for (int rank = 0; rank < 8; ++rank) {
    auto plan = PlanRank(**m, {8, rank, 1, 0}, {256, 1ull << 30, true});
    ASSERT_TRUE(plan.ok()) << plan.status();
    for (const auto& t : plan->tensors) {
      if (t.name != k->name) continue;
      EXPECT_EQ(t.shape, (std::vector<int64_t>{32, 256})) << rank;
      EXPECT_EQ(t.file_offset, k->file_offset + (rank / 4) * 32 * 256 * 2) << rank;
    }
  }
}

TEST(PlanRank, TpOneHfIsTheLegacyPlanForAnyArchitecture) {
  TempDir dir;
  ASSERT_TRUE(safetensors::WriteLlamaCheckpoint(dir.path(), {}).ok());
  // An architecture without a preset is still served whole at tp 1.
  std::ifstream in(dir / "config.json");
  std::string config((std::istreambuf_iterator<char>(in)), {});
  config.replace(config.find("LlamaForCausalLM"), 16, "SomethingNewForCausalLM");
  std::ofstream(dir / "config.json", std::ios::trunc) << config;
  auto m = Open(dir.path());
  ASSERT_TRUE(m.ok()) << m.status();
  PlanOptions opts{256, 8 << 20};
  auto plan = PlanRank(**m, {}, opts);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(plan->views.empty());
  // The plan as it was before sharding: name order, aligned, new segment on overflow.
  uint64_t cursor = 0;
  std::vector<uint64_t> segs;
  size_t i = 0;
  for (const auto& t : (*m)->checkpoint.tensors()) {
    uint64_t at = (cursor + 255) / 256 * 256;
    if (segs.empty() || (at + t.nbytes > opts.max_segment_bytes && at > 0)) {
      segs.push_back(0);
      at = 0;
    }
    const PlannedTensor& p = plan->tensors[i++];
    EXPECT_EQ(p.name, t.name);
    EXPECT_EQ(p.shape, t.shape);
    EXPECT_EQ(p.segment, segs.size() - 1);
    EXPECT_EQ(p.offset, at);
    EXPECT_EQ(p.nbytes, t.nbytes);
    EXPECT_EQ(p.file_offset, t.file_offset);
    EXPECT_TRUE(p.pieces.empty());
    cursor = at + t.nbytes;
    segs.back() = cursor;
  }
  EXPECT_EQ(plan->segment_bytes, segs);
  EXPECT_GT(segs.size(), 1u);
  // Anything else needs the preset.
  auto tp2 = PlanRank(**m, {2, 0, 1, 0}, {256, 8 << 20, true});
  ASSERT_EQ(tp2.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(Msg(tp2.status()),
              HasSubstr("architecture 'SomethingNewForCausalLM' has no tensor-parallel sharding "
                        "preset (known: DeepseekV3ForCausalLM, LlamaForCausalLM, "
                        "MixtralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, "
                        "Qwen3MoeForCausalLM)"));
}

// ---- Fused layouts ----

// Places every tensor of `plan` into host buffers (one per segment) the way the loader does.
std::vector<std::vector<uint8_t>> Materialize(const OpenedModel& m, const Plan& plan) {
  std::vector<std::vector<uint8_t>> segs;
  for (uint64_t n : plan.segment_bytes) segs.emplace_back(n, 0);
  for (const auto& t : plan.tensors) {
    std::vector<uint8_t> b = ReadShard(m, t);
    std::memcpy(segs[t.segment].data() + t.offset, b.data(), b.size());
  }
  return segs;
}

TEST(PlanRank, FusedViewsAliasContiguousShards) {
  for (const char* arch : {"Qwen2ForCausalLM", "DeepseekV3ForCausalLM"}) {
    for (bool fp8 : {false, true}) {
      for (const char* layout : {"sglang", "vllm"}) {
        SCOPED_TRACE(absl::StrCat(arch, fp8 ? " fp8 " : " bf16 ", layout));
        TempDir dir;
        ArchShape s;
        s.architecture = arch;
        s.fp8 = fp8;
        s.block = 16;
        s.layers = 2;
        ASSERT_TRUE(safetensors::WriteArchCheckpoint(dir.path(), s).ok());
        auto m = Open(dir.path(), 2, layout);
        ASSERT_TRUE(m.ok()) << m.status();
        auto plan = PlanRank(**m, {2, 1, 1, 0}, {256, 1ull << 30, true});
        ASSERT_TRUE(plan.ok()) << plan.status();
        const auto segs = Materialize(**m, *plan);
        std::map<std::string, const PlannedTensor*> by;
        for (const auto& t : plan->tensors) by[t.name] = &t;
        std::set<std::string> views;
        for (const auto& v : plan->views) {
          views.insert(v.name);
          ASSERT_LE(v.offset + v.nbytes, plan->segment_bytes[v.segment]) << v.name;
        }
        // Every fused view is exactly its members' bytes back to back.
        auto check = [&](const std::string& fused, const std::vector<std::string>& parts) {
          SCOPED_TRACE(fused);
          auto it = std::find_if(plan->views.begin(), plan->views.end(),
                                 [&](const auto& v) { return v.name == fused; });
          ASSERT_NE(it, plan->views.end());
          std::vector<uint8_t> want;
          int64_t rows = 0;
          for (const auto& p : parts) {
            const PlannedTensor* t = by.at(p);
            const auto b = ReadShard(**m, *t);
            want.insert(want.end(), b.begin(), b.end());
            rows += t->shape[0];
            EXPECT_EQ(t->segment, it->segment);
          }
          EXPECT_EQ(it->shape[0], rows);
          EXPECT_EQ(it->offset, by.at(parts[0])->offset);
          EXPECT_EQ(it->offset % 256, 0u);
          ASSERT_EQ(it->nbytes, want.size());
          EXPECT_TRUE(std::equal(want.begin(), want.end(), segs[it->segment].begin() + it->offset));
        };
        for (int layer = 0; layer < s.layers; ++layer) {
          const std::string l = absl::StrCat("model.layers.", layer, ".");
          std::vector<std::string> params = {"weight"};
          if (fp8) params.emplace_back("weight_scale_inv");
          for (const auto& param : params) {
            if (std::string(arch) == "Qwen2ForCausalLM") {
              check(l + "self_attn.qkv_proj." + param,
                    {l + "self_attn.q_proj." + param, l + "self_attn.k_proj." + param,
                     l + "self_attn.v_proj." + param});
              check(l + "mlp.gate_up_proj." + param,
                    {l + "mlp.gate_proj." + param, l + "mlp.up_proj." + param});
            } else {
              const std::string mla = std::string(layout) == "sglang" ? "fused_qkv_a_proj_with_mqa"
                                                                      : "fused_qkv_a_proj";
              check(
                  l + "self_attn." + mla + "." + param,
                  {l + "self_attn.q_a_proj." + param, l + "self_attn.kv_a_proj_with_mqa." + param});
              const std::string mlp = layer == 0 ? "mlp." : "mlp.shared_experts.";
              check(l + mlp + "gate_up_proj." + param,
                    {l + mlp + "gate_proj." + param, l + mlp + "up_proj." + param});
            }
          }
          if (std::string(arch) == "Qwen2ForCausalLM") {
            check(l + "self_attn.qkv_proj.bias",
                  {l + "self_attn.q_proj.bias", l + "self_attn.k_proj.bias",
                   l + "self_attn.v_proj.bias"});
          }
        }
        // No fused view for routed experts (engines stack those in FusedMoE) or hf names.
        for (const auto& v : views) EXPECT_FALSE(Has(v, ".experts.")) << v;
      }
    }
  }
}

TEST(PlanRank, HfLayoutHasNoViewsAndNoPadding) {
  TempDir dir;
  ArchShape s;
  s.vocab = 1000;
  ASSERT_TRUE(safetensors::WriteArchCheckpoint(dir.path(), s).ok());
  auto m = Open(dir.path(), 2, "hf");
  ASSERT_TRUE(m.ok()) << m.status();
  auto plan = PlanRank(**m, {2, 1, 1, 0}, {256, 1ull << 30, true});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(plan->views.empty());
  auto lm_head = std::find_if(plan->tensors.begin(), plan->tensors.end(),
                              [](const auto& t) { return t.name == "lm_head.weight"; });
  ASSERT_NE(lm_head, plan->tensors.end());
  EXPECT_EQ(lm_head->shape, (std::vector<int64_t>{500, 256}));
  EXPECT_TRUE(lm_head->pieces.empty());
  // sglang pads 1000 to 1024: rank 1 holds rows 512..999 and 24 zero rows.
  auto ms = Open(dir.path(), 2, "sglang");
  ASSERT_TRUE(ms.ok());
  auto ps = PlanRank(**ms, {2, 1, 1, 0}, {256, 1ull << 30, true});
  ASSERT_TRUE(ps.ok()) << ps.status();
  lm_head = std::find_if(ps->tensors.begin(), ps->tensors.end(),
                         [](const auto& t) { return t.name == "lm_head.weight"; });
  ASSERT_NE(lm_head, ps->tensors.end());
  EXPECT_EQ(lm_head->shape, (std::vector<int64_t>{512, 256}));
  EXPECT_EQ(PaddingRanges(*lm_head),
            (std::vector<std::pair<uint64_t, uint64_t>>{{488 * 512, 512 * 512}}));
  const auto bytes = ReadShard(**ms, *lm_head);
  EXPECT_TRUE(
      std::all_of(bytes.begin() + 488 * 512, bytes.end(), [](uint8_t b) { return b == 0; }));
}

// ---- Pieces ----

TEST(Pieces, GatherAndPerRowReadsAgree) {
  TempDir dir;
  ArchShape s;
  ASSERT_TRUE(safetensors::WriteArchCheckpoint(dir.path(), s).ok());
  auto m = Open(dir.path());
  ASSERT_TRUE(m.ok());
  auto plan = PlanRank(**m, {4, 3, 1, 0}, {256, 1ull << 30, true});
  ASSERT_TRUE(plan.ok()) << plan.status();
  int strided = 0;
  for (const auto& t : plan->tensors) {
    if (t.pieces.empty()) continue;
    ++strided;
    EXPECT_TRUE(ReadShard(**m, t, 1) == ReadShard(**m, t, 1ull << 30)) << t.name;
    std::vector<safetensors::ReadRequest> reqs;
    std::vector<uint8_t> buf(t.nbytes, 0);
    AppendReadRequests(t, (*m)->checkpoint.files()[t.file_index].fd(), buf.data(), t.name, &reqs);
    ASSERT_TRUE(safetensors::ReadRanges(reqs, {}).ok());
    EXPECT_TRUE(buf == ReadShard(**m, t)) << t.name;
  }
  EXPECT_GT(strided, 0);
}

// ---- Loading a plan with pieces through the host backend ----

TEST(PlanRank, PiecesAreRefusedUnlessTheLoaderReadsThem) {
  TempDir dir;
  ASSERT_TRUE(safetensors::WriteArchCheckpoint(dir.path(), {}).ok());
  auto m = Open(dir.path());
  ASSERT_TRUE(m.ok());
  auto plan = PlanRank(**m, {2, 0, 1, 0}, PlanOptions{});
  ASSERT_EQ(plan.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(Msg(plan.status()), HasSubstr("needs strided or padded reads (tensor '"));
}

// ---- Bad input ----

TEST(PlanRank, TensorNoRuleCoversIsNamed) {
  TempDir dir;
  ASSERT_TRUE(safetensors::WriteArchCheckpoint(dir.path(), {}).ok());
  safetensors::TensorData extra{
      "model.layers.0.mlp.mystery_proj.weight", DType::kBF16, {4, 4}, std::vector<uint8_t>(32, 1)};
  ASSERT_TRUE(safetensors::WriteFile(dir / "extra.safetensors", {extra}).ok());
  auto m = Open(dir.path());
  ASSERT_TRUE(m.ok()) << m.status();
  auto plan = PlanRank(**m, {2, 0, 1, 0}, {256, 1ull << 30, true});
  ASSERT_EQ(plan.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_EQ(Msg(plan.status()),
            "model 'm': tensor 'model.layers.0.mlp.mystery_proj.weight': no sharding rule of "
            "LlamaForCausalLM covers it (refusing to guess: replicating it could be wrong for "
            "the engine)");
  // At tp 1 as stored it is served like any tensor.
  EXPECT_TRUE(PlanRank(**m, {}, {}).ok());
}

TEST(PlanRank, TpSizeNotDividingHeads) {
  TempDir dir;
  ASSERT_TRUE(safetensors::WriteArchCheckpoint(dir.path(), {}).ok());  // 8 heads, 4 kv heads
  auto m = Open(dir.path());
  ASSERT_TRUE(m.ok());
  auto plan = PlanRank(**m, {3, 0, 1, 0}, {256, 1ull << 30, true});
  ASSERT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(plan.status()), HasSubstr("tp_size 3 does not divide num_attention_heads 8"));
  plan = PlanRank(**m, {16, 0, 1, 0}, {256, 1ull << 30, true});
  ASSERT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(plan.status()), HasSubstr("tp_size 16 does not divide num_attention_heads 8"));

  // 12 heads, 3 kv heads, tp 4: q splits, but 3 kv heads cannot be replicated over 4 ranks.
  TempDir dir2;
  ArchShape s;
  s.hidden = 384;
  s.heads = 12;
  s.kv_heads = 3;
  ASSERT_TRUE(safetensors::WriteArchCheckpoint(dir2.path(), s).ok());
  auto m2 = Open(dir2.path());
  ASSERT_TRUE(m2.ok());
  plan = PlanRank(**m2, {4, 0, 1, 0}, {256, 1ull << 30, true});
  ASSERT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(plan.status()),
              HasSubstr("num_key_value_heads 3 is fewer than tp_size 4 and does not divide it"));

  // An intermediate size that does not split.
  TempDir dir3;
  ArchShape s3;
  s3.intermediate = 500;
  ASSERT_TRUE(safetensors::WriteArchCheckpoint(dir3.path(), s3).ok());
  auto m3 = Open(dir3.path());
  ASSERT_TRUE(m3.ok());
  plan = PlanRank(**m3, {8, 0, 1, 0}, {256, 1ull << 30, true});
  ASSERT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(plan.status()),
              HasSubstr("tensor 'model.layers.0.mlp.down_proj.weight': dim 1 of size 500 does "
                        "not divide into 8 equal parts (tp_size 8)"));
}

TEST(PlanRank, Fp8SplitOffBlockBoundaryIsNamed) {
  TempDir dir;
  ArchShape s;
  s.architecture = "DeepseekV3ForCausalLM";
  s.fp8 = true;
  s.block = 128;
  s.qk_nope_head_dim = 64;  // q_b_proj / kv_b_proj: 8 heads x 128 = 1024 rows
  s.qk_rope_head_dim = 64;
  s.v_head_dim = 64;  // o_proj: 512 columns
  s.moe_intermediate = 512;
  ASSERT_TRUE(safetensors::WriteArchCheckpoint(dir.path(), s).ok());
  auto m = Open(dir.path());
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_EQ((*m)->quantization.method, "fp8_block");
  auto plan = PlanRank(**m, {8, 0, 1, 0}, {256, 1ull << 30, true});
  ASSERT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(plan.status()),
              HasSubstr("tensor 'model.layers.0.mlp.down_proj.weight': splitting dim 1 (size 512) "
                        "into 8 parts of 64 is not on a 128-element weight block boundary "
                        "(quantization_config.weight_block_size [128, 128])"));
  // tp 4: every split is whole blocks (512 / 4 = 128), scales follow.
  auto ok = PlanRank(**m, {4, 1, 1, 0}, {256, 1ull << 30, true});
  ASSERT_TRUE(ok.ok()) << ok.status();
  int checked = 0;
  for (const auto& t : ok->tensors) {
    if (t.name == "model.layers.0.self_attn.q_b_proj.weight_scale_inv") {
      EXPECT_EQ(t.shape, (std::vector<int64_t>{2, 1}));  // [1024/4/128, ceil(128/128)]
      ++checked;
    }
    // kv_a_proj_with_mqa is replicated: 192 rows, a ragged second block row.
    if (t.name == "model.layers.0.self_attn.kv_a_proj_with_mqa.weight_scale_inv") {
      EXPECT_EQ(t.shape, (std::vector<int64_t>{2, 2}));
      ++checked;
    }
    if (t.name == "model.layers.0.self_attn.o_proj.weight_scale_inv") {
      EXPECT_EQ(t.shape, (std::vector<int64_t>{2, 1}));  // [256/128, 512/4/128]
      ++checked;
    }
  }
  EXPECT_EQ(checked, 3);
}

// ---- Online fp8_block (spec quantization: fp8_block on a bf16 checkpoint) ----

TEST(OnlineFp8, QuantizedLayerRule) {
  for (const char* yes :
       {"model.layers.0.self_attn.q_proj.weight", "model.layers.3.self_attn.o_proj.weight",
        "model.layers.0.mlp.down_proj.weight", "model.layers.1.mlp.experts.7.gate_proj.weight",
        "model.layers.1.block_sparse_moe.experts.0.w2.weight",
        "model.layers.0.self_attn.kv_a_proj_with_mqa.weight",
        "model.layers.0.self_attn.q_b_proj.weight",
        "model.layers.1.mlp.shared_experts.up_proj.weight"}) {
    EXPECT_TRUE(IsOnlineQuantized(yes)) << yes;
  }
  for (const char* no :
       {"model.embed_tokens.weight", "lm_head.weight", "model.norm.weight",
        "model.layers.0.input_layernorm.weight", "model.layers.0.self_attn.q_proj.bias",
        "model.layers.1.mlp.gate.weight", "model.layers.1.block_sparse_moe.gate.weight",
        "model.layers.1.mlp.shared_expert_gate.weight", "model.layers.3.eh_proj.weight",
        "model.layers.3.shared_head.head.weight", "model.layers.1.mlp.gate.e_score_correction_bias",
        "model.layers.0.self_attn.kv_a_layernorm.weight",
        "model.layers.0.self_attn.q_norm.weight"}) {
    EXPECT_FALSE(IsOnlineQuantized(no)) << no;
  }
}

TEST(OnlineFp8, EveryPresetPlansF8WeightsAndScalesOfTheShard) {
  for (const ArchShape& shape : AllPresets(false)) {
    SCOPED_TRACE(shape.architecture);
    TempDir dir;
    ASSERT_TRUE(safetensors::WriteArchCheckpoint(dir.path(), shape).ok());
    spec::ModelSpec sp;
    sp.name = "m";
    sp.model_dir = dir.path();
    sp.quantization = "fp8_block";
    auto m = OpenModel(sp);
    ASSERT_TRUE(m.ok()) << m.status();
    for (int tp : {1, 2}) {
      auto plain = PlanRank(**m, {tp, tp - 1, 1, 0}, {256, 1ull << 30, true});
      ASSERT_TRUE(plain.ok()) << plain.status();
      std::map<std::string, const PlannedTensor*> by_name;
      for (const auto& t : plain->tensors) by_name[t.name] = &t;
      int quantized = 0;
      for (const auto& info : (*m)->checkpoint.tensors()) {
        const PlannedTensor* t = by_name.at(info.name);
        if (!IsOnlineQuantized(info.name)) {
          EXPECT_EQ(t->dtype, info.dtype) << info.name;
          EXPECT_FALSE(t->quant.has_value()) << info.name;
          EXPECT_EQ(by_name.count(info.name + "_scale_inv"), 0u) << info.name;
          continue;
        }
        ++quantized;
        ASSERT_TRUE(t->quant.has_value()) << info.name;
        EXPECT_EQ(t->dtype, DType::kF8_E4M3);
        EXPECT_EQ(t->nbytes, static_cast<uint64_t>(t->shape[0] * t->shape[1]));
        EXPECT_EQ(t->quant->src_nbytes, t->nbytes * 2);
        // The shard's shape: tp 1 whole, tp 2 half of one dimension (or whole if replicated).
        EXPECT_EQ(t->shape[0] * t->shape[1] * (tp == 1 ? 1 : 2) % (info.shape[0] * info.shape[1]),
                  0)
            << info.name;
        const PlannedTensor* sc = by_name.at(info.name + "_scale_inv");
        EXPECT_EQ(sc->dtype, DType::kF32);
        EXPECT_EQ(sc->scale_of, info.name);
        EXPECT_EQ(sc->shape,
                  (std::vector<int64_t>{(t->shape[0] + 127) / 128, (t->shape[1] + 127) / 128}));
        EXPECT_EQ(sc->nbytes, static_cast<uint64_t>(sc->shape[0] * sc->shape[1] * 4));
      }
      EXPECT_GT(quantized, 0);
      EXPECT_EQ(plain->tensors.size(), (*m)->checkpoint.tensors().size() + quantized);
    }
  }
}

TEST(OnlineFp8, FusedScaleAcrossMemberBlocksIsNamed) {
  // Llama at tp 2 with 2 k/v heads of 64: k_proj holds 64 rows per rank, so the engine's
  // fused qkv_proj would be quantized across the q|k|v boundaries: refused, named.
  TempDir dir;
  safetensors::LlamaShape ls;
  ls.hidden = 512;
  ls.heads = 8;
  ls.kv_heads = 2;
  ls.intermediate = 1024;  // gate/up: whole blocks at tp 1 and 2
  ASSERT_TRUE(safetensors::WriteLlamaCheckpoint(dir.path(), ls).ok());
  spec::ModelSpec sp;
  sp.name = "m";
  sp.model_dir = dir.path();
  sp.quantization = "fp8_block";
  sp.layout = "sglang";
  auto m = OpenModel(sp);
  ASSERT_TRUE(m.ok()) << m.status();
  auto plan = PlanRank(**m, {2, 0, 1, 0}, {256, 1ull << 30, true});
  ASSERT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument) << plan.status();
  EXPECT_THAT(Msg(plan.status()),
              HasSubstr("fused view 'model.layers.0.self_attn.qkv_proj.weight_scale_inv': member "
                        "'model.layers.0.self_attn.k_proj.weight' has 64 rows on this rank, not a "
                        "multiple of the 128-row weight block"));
  // tp 1: q 512 rows, k 128 rows: whole blocks; the fused weight and scale are views.
  auto ok = PlanRank(**m, {1, 0, 1, 0}, {256, 1ull << 30, true});
  ASSERT_TRUE(ok.ok()) << ok.status();
  int views = 0;
  for (const auto& v : ok->views) {
    if (v.name == "model.layers.0.self_attn.qkv_proj.weight") {
      EXPECT_EQ(v.dtype, DType::kF8_E4M3);
      EXPECT_EQ(v.shape, (std::vector<int64_t>{512 + 2 * 128, 512}));
      ++views;
    }
    if (v.name == "model.layers.0.self_attn.qkv_proj.weight_scale_inv") {
      EXPECT_EQ(v.dtype, DType::kF32);
      EXPECT_EQ(v.shape, (std::vector<int64_t>{4 + 1 + 1, 4}));
      ++views;
    }
  }
  EXPECT_EQ(views, 2);
}

}  // namespace
}  // namespace weightcache::load
