#include "pkg/load/shard_rules.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace weightcache::load {
namespace {

constexpr std::string_view kScaleSuffix = ".weight_scale_inv";

std::vector<ShardRule> Concat(std::initializer_list<std::vector<ShardRule>> parts) {
  std::vector<ShardRule> out;
  for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

// Embeddings, final norm and the per-layer norms every decoder here has.
std::vector<ShardRule> Common() {
  return {
      {"model.embed_tokens.weight", Split::kVocab},
      {"lm_head.weight", Split::kVocab},
      {"model.norm.weight", Split::kReplicated},
      {"model.layers.*.input_layernorm.weight", Split::kReplicated},
      {"model.layers.*.post_attention_layernorm.weight", Split::kReplicated},
  };
}

// Multi-head / grouped-query attention (Llama, Qwen2/3, Mixtral), with the optional biases
// (Qwen2 has q/k/v biases; Llama's attention_bias adds o_proj's too).
std::vector<ShardRule> GqaAttention() {
  return {
      {"model.layers.*.self_attn.q_proj.weight", Split::kColumn, Heads::kAttention},
      {"model.layers.*.self_attn.q_proj.bias", Split::kColumn, Heads::kAttention},
      {"model.layers.*.self_attn.k_proj.weight", Split::kColumn, Heads::kKeyValue},
      {"model.layers.*.self_attn.k_proj.bias", Split::kColumn, Heads::kKeyValue},
      {"model.layers.*.self_attn.v_proj.weight", Split::kColumn, Heads::kKeyValue},
      {"model.layers.*.self_attn.v_proj.bias", Split::kColumn, Heads::kKeyValue},
      {"model.layers.*.self_attn.o_proj.weight", Split::kRow, Heads::kAttention},
      {"model.layers.*.self_attn.o_proj.bias", Split::kReplicated},
      // Older Llama checkpoints store the RoPE frequencies; engines recompute them.
      {"model.layers.*.self_attn.rotary_emb.inv_freq", Split::kReplicated},
  };
}

// Qwen3's per-head RMSNorm of q and k ([head_dim]: the same on every rank).
std::vector<ShardRule> QkNorm() {
  return {
      {"model.layers.*.self_attn.q_norm.weight", Split::kReplicated},
      {"model.layers.*.self_attn.k_norm.weight", Split::kReplicated},
  };
}

// A gated MLP under `prefix` (gate/up column, down row; down's bias replicated).
std::vector<ShardRule> GatedMlp(const std::string& prefix) {
  return {
      {prefix + ".gate_proj.weight", Split::kColumn},
      {prefix + ".gate_proj.bias", Split::kColumn},
      {prefix + ".up_proj.weight", Split::kColumn},
      {prefix + ".up_proj.bias", Split::kColumn},
      {prefix + ".down_proj.weight", Split::kRow},
      {prefix + ".down_proj.bias", Split::kReplicated},
  };
}

EngineLayout Hf() { return {"hf", 1, {}}; }

// SGLang and vLLM fuse the same tensors; their vocab padding is DEFAULT_VOCAB_PADDING_SIZE.
// `mla_fused` is the name each gives DeepSeek's fused q_a_proj + kv_a_proj_with_mqa.
EngineLayout Engine(const std::string& name, bool moe_shared, const std::string& mla_fused) {
  EngineLayout l{name, 64, {}};
  l.fused.push_back({"model.layers.*.self_attn", "qkv_proj", {"q_proj", "k_proj", "v_proj"}});
  l.fused.push_back({"model.layers.*.mlp", "gate_up_proj", {"gate_proj", "up_proj"}});
  if (moe_shared) {
    l.fused.push_back(
        {"model.layers.*.mlp.shared_experts", "gate_up_proj", {"gate_proj", "up_proj"}});
  }
  if (!mla_fused.empty()) {
    l.fused.push_back({"model.layers.*.self_attn", mla_fused, {"q_a_proj", "kv_a_proj_with_mqa"}});
  }
  return l;
}

std::vector<EngineLayout> Layouts(bool moe_shared = false, bool mla = false) {
  return {Hf(), Engine("sglang", moe_shared, mla ? "fused_qkv_a_proj_with_mqa" : ""),
          Engine("vllm", moe_shared, mla ? "fused_qkv_a_proj" : "")};
}

std::vector<ArchPreset> BuildPresets() {
  std::vector<ArchPreset> p;
  const auto dense = Concat({Common(), GqaAttention(), GatedMlp("model.layers.*.mlp")});
  p.push_back({"LlamaForCausalLM", dense, Layouts()});
  p.push_back({"Qwen2ForCausalLM", dense, Layouts()});
  p.push_back({"Qwen3ForCausalLM", Concat({dense, QkNorm()}), Layouts()});
  p.push_back({"Qwen3MoeForCausalLM",
               Concat({Common(),
                       GqaAttention(),
                       QkNorm(),
                       {{"model.layers.*.mlp.gate.weight", Split::kReplicated}},  // router
                       GatedMlp("model.layers.*.mlp.experts.*"),
                       GatedMlp("model.layers.*.mlp")}),  // mlp_only_layers
               Layouts()});
  p.push_back({"MixtralForCausalLM",
               Concat({Common(),
                       GqaAttention(),
                       {
                           {"model.layers.*.block_sparse_moe.gate.weight", Split::kReplicated},
                           {"model.layers.*.block_sparse_moe.experts.*.w1.weight", Split::kColumn},
                           {"model.layers.*.block_sparse_moe.experts.*.w3.weight", Split::kColumn},
                           {"model.layers.*.block_sparse_moe.experts.*.w2.weight", Split::kRow},
                       }}),
               Layouts()});
  // DeepSeek V3 (and V2): multi-head latent attention. The low-rank "a" projections and their
  // norms are replicated; the per-head "b" projections are column-parallel over the attention
  // heads, o_proj row-parallel. q_proj replaces q_a/q_b when q_lora_rank is null (V2-Lite).
  // Layers 0..first_k_dense_replace-1 have a dense MLP, the others a router (with its
  // e_score_correction_bias), routed experts and shared experts. The multi-token-prediction
  // layer (model.layers.<num_hidden_layers>.*) adds enorm/hnorm/eh_proj/shared_head and its
  // own embed_tokens; eh_proj is a plain replicated Linear in both engines.
  p.push_back(
      {"DeepseekV3ForCausalLM",
       Concat({Common(),
               {
                   {"model.layers.*.self_attn.q_proj.weight", Split::kColumn, Heads::kAttention},
                   {"model.layers.*.self_attn.q_a_proj.weight", Split::kReplicated},
                   {"model.layers.*.self_attn.q_a_layernorm.weight", Split::kReplicated},
                   {"model.layers.*.self_attn.q_b_proj.weight", Split::kColumn, Heads::kAttention},
                   {"model.layers.*.self_attn.kv_a_proj_with_mqa.weight", Split::kReplicated},
                   {"model.layers.*.self_attn.kv_a_layernorm.weight", Split::kReplicated},
                   {"model.layers.*.self_attn.kv_b_proj.weight", Split::kColumn, Heads::kAttention},
                   {"model.layers.*.self_attn.o_proj.weight", Split::kRow, Heads::kAttention},
                   {"model.layers.*.mlp.gate.weight", Split::kReplicated},
                   {"model.layers.*.mlp.gate.e_score_correction_bias", Split::kReplicated},
                   {"model.layers.*.enorm.weight", Split::kReplicated},
                   {"model.layers.*.hnorm.weight", Split::kReplicated},
                   {"model.layers.*.eh_proj.weight", Split::kReplicated},
                   {"model.layers.*.shared_head.norm.weight", Split::kReplicated},
                   {"model.layers.*.shared_head.head.weight", Split::kVocab},
                   {"model.layers.*.embed_tokens.weight", Split::kVocab},
               },
               GatedMlp("model.layers.*.mlp.experts.*"),
               GatedMlp("model.layers.*.mlp.shared_experts"),
               GatedMlp("model.layers.*.mlp")}),
       Layouts(/*moe_shared=*/true, /*mla=*/true)});
  std::sort(p.begin(), p.end(),
            [](const auto& a, const auto& b) { return a.architecture < b.architecture; });
  return p;
}

const std::vector<ArchPreset>& Presets() {
  static const auto* presets = new std::vector<ArchPreset>(BuildPresets());
  return *presets;
}

bool GlobAt(std::string_view p, std::string_view t) {
  while (!p.empty()) {
    if (p.front() == '*') {
      p.remove_prefix(1);
      // One or more non-'.' characters; try the shortest first.
      for (size_t n = 1; n <= t.size() && t[n - 1] != '.'; ++n) {
        if (GlobAt(p, t.substr(n))) return true;
      }
      return false;
    }
    if (t.empty() || p.front() != t.front()) return false;
    p.remove_prefix(1);
    t.remove_prefix(1);
  }
  return t.empty();
}

}  // namespace

std::string_view SplitName(Split split) {
  switch (split) {
    case Split::kReplicated:
      return "replicated";
    case Split::kColumn:
      return "column";
    case Split::kRow:
      return "row";
    case Split::kVocab:
      return "vocab";
  }
  return "?";
}

bool GlobMatch(std::string_view pattern, std::string_view text) { return GlobAt(pattern, text); }

std::vector<std::string> PresetArchitectures() {
  std::vector<std::string> out;
  for (const auto& p : Presets()) out.push_back(p.architecture);
  return out;
}

absl::StatusOr<const ArchPreset*> FindPreset(const std::string& architecture) {
  for (const auto& p : Presets()) {
    if (p.architecture == architecture) return &p;
  }
  return absl::UnimplementedError(absl::StrCat("architecture '", architecture,
                                               "' has no tensor-parallel sharding preset (known: ",
                                               absl::StrJoin(PresetArchitectures(), ", "), ")"));
}

absl::StatusOr<const ShardRule*> FindRule(const ArchPreset& preset, const std::string& tensor) {
  std::string_view name = tensor;
  std::string weight;
  if (name.size() > kScaleSuffix.size() &&
      name.substr(name.size() - kScaleSuffix.size()) == kScaleSuffix) {
    weight = std::string(name.substr(0, name.size() - kScaleSuffix.size())) + ".weight";
    name = weight;
  }
  for (const auto& r : preset.rules) {
    if (GlobMatch(r.pattern, name)) return &r;
  }
  return absl::UnimplementedError(
      absl::StrCat("tensor '", tensor, "': no sharding rule of ", preset.architecture,
                   " covers it (refusing to guess: replicating it could "
                   "be wrong for the engine)"));
}

absl::StatusOr<const EngineLayout*> FindLayout(const ArchPreset& preset, const std::string& name) {
  std::vector<std::string> names;
  for (const auto& l : preset.layouts) {
    if (l.name == name) return &l;
    names.push_back(l.name);
  }
  return absl::InvalidArgumentError(absl::StrCat("layout '", name, "' is not one of ",
                                                 absl::StrJoin(names, ", "), " for ",
                                                 preset.architecture));
}

}  // namespace weightcache::load
