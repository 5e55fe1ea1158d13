// Tensor-parallel sharding rules as data: per architecture (config.json's `architectures`),
// a table of tensor-name patterns and how each matching tensor is split across tp ranks,
// plus the groups of tensors that engines fuse (q/k/v -> qkv_proj, gate/up -> gate_up_proj)
// under each engine layout. Nothing here reads a file; the planner (plan.h) applies it.
//
// Patterns are globs over the full tensor name: `*` matches one or more characters other
// than '.', so "model.layers.*.mlp.experts.*.down_proj.weight" matches every layer and
// expert and nothing else; every other character matches itself.
//
// Split kinds (for a row-major [out, in] weight as stored by HF checkpoints):
//   column      split dim 0 (output rows): q/k/v, gate/up, per-expert gate/up, MLA q_b/kv_b;
//               a rank's shard is one contiguous byte range. 1-D biases split the same way.
//   row         split dim 1 (input columns): o_proj, down_proj, per-expert down; a rank's
//               shard is strided (one run per row). Biases of row-parallel layers are
//               replicated (engines add them once, after the all-reduce).
//   vocab       split dim 0 of embed_tokens / lm_head, after padding the vocabulary to a
//               multiple of the layout's vocab_pad (1 for hf, 64 for sglang and vllm, their
//               DEFAULT_VOCAB_PADDING_SIZE); padded rows are zeros, and the padded total must
//               divide by tp_size. Each rank's shard has padded_vocab / tp_size rows.
//   replicated  every rank holds the whole tensor: norms, routers (mlp.gate), MLA's
//               q_a_proj / kv_a_proj_with_mqa, row-parallel biases.
//
// Heads: a rule may tie its split to a head count from config.json, so that a bad tp_size is
// reported as "tp_size 3 does not divide num_attention_heads 32", not as a byte size:
//   kAttention  num_attention_heads must divide by tp_size.
//   kKeyValue   GQA k/v: with num_key_value_heads >= tp_size it must divide by tp_size; with
//               fewer k/v heads than ranks, tp_size must divide by num_key_value_heads and
//               the k/v heads are REPLICATED the way vLLM and SGLang do it: ranks
//               r*kv/tp .. hold head floor(r * kv / tp), i.e. tp/kv consecutive ranks share
//               one head. (Never a silent fallback: every other case is an error.)
//
// Block-FP8 scales (`<x>.weight_scale_inv`) follow the rule of `<x>.weight`, split in blocks.
//
// Thread-safety: the preset table is immutable static data; functions are pure.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace weightcache::load {

enum class Split { kReplicated, kColumn, kRow, kVocab };
enum class Heads { kNone, kAttention, kKeyValue };

std::string_view SplitName(Split split);

struct ShardRule {
  std::string pattern;  // glob over the full tensor name
  Split split = Split::kReplicated;
  Heads heads = Heads::kNone;
};

// Tensors an engine fuses into one parameter. For every module path P matching
// `module_pattern` and every parameter suffix S (weight, bias, weight_scale_inv), the tensors
// P.<part>.S (in `parts` order) are placed back to back, and a view P.<fused>.S aliases them.
struct FusedGroup {
  std::string module_pattern;      // glob, e.g. "model.layers.*.self_attn"
  std::string fused;               // e.g. "qkv_proj"
  std::vector<std::string> parts;  // e.g. {"q_proj", "k_proj", "v_proj"}
};

struct EngineLayout {
  std::string name;  // "hf" | "sglang" | "vllm" (spec `layout`)
  int vocab_pad = 1;
  std::vector<FusedGroup> fused;
};

struct ArchPreset {
  std::string architecture;           // config.json's architectures[0]
  std::vector<ShardRule> rules;       // first match wins
  std::vector<EngineLayout> layouts;  // hf, sglang, vllm
};

// Full-string glob match (see above).
bool GlobMatch(std::string_view pattern, std::string_view text);

// The preset for an architecture; UNIMPLEMENTED naming it and the known list otherwise.
absl::StatusOr<const ArchPreset*> FindPreset(const std::string& architecture);
// Every preset's architecture name, sorted.
std::vector<std::string> PresetArchitectures();

// The rule covering `tensor`: scale tensors (`.weight_scale_inv`) take their weight's rule.
// UNIMPLEMENTED naming the tensor and the architecture when no rule covers it (never a
// silent replicate). (Not NOT_FOUND: the daemon reports that code as a cache miss.)
absl::StatusOr<const ShardRule*> FindRule(const ArchPreset& preset, const std::string& tensor);

// The engine layout named `name` ("hf", "sglang", "vllm") of `preset`.
absl::StatusOr<const EngineLayout*> FindLayout(const ArchPreset& preset, const std::string& name);

}  // namespace weightcache::load
