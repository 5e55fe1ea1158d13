// What weightcache reads from a checkpoint's config.json, and the quantization allowlist.
// Thread-safety: plain values and pure functions.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "pkg/spec/spec.h"

namespace weightcache::spec {

// Served quantizations: "none" and "fp8_block" (quant_method fp8 with weight_block_size).
// Everything else (per-tensor fp8, awq, gptq, marlin, bitsandbytes, unknown...) is refused
// with UNIMPLEMENTED naming the method and this list, before any weight byte is read.
inline constexpr const char* kSupportedQuantizations = "none, fp8_block";

// Block size of online quantization (DeepSeek's and the engines' 128x128).
inline constexpr int kOnlineFp8Block = 128;

struct Quantization {
  std::string method = "none";         // "none" | "fp8_block"
  std::vector<int> weight_block_size;  // fp8_block: e.g. {128, 128}
  // fp8_block quantized by weightcache while loading an unquantized BF16/F16 checkpoint
  // (spec `quantization: fp8_block`); false for a pre-quantized checkpoint.
  bool online = false;
  std::string canonical_config;  // canonical JSON of quantization_config ("" for none)
  std::string config_sha256;     // hex SHA-256 of canonical_config ("" for none)
};

struct ModelConfig {
  std::string architecture;  // "architectures"[0]
  std::string torch_dtype;   // as in config.json ("bfloat16"), may be empty
  Quantization quantization;
  // Attention heads, for tensor-parallel sharding: 0 when config.json has none.
  // num_key_value_heads defaults to num_attention_heads (as transformers does).
  int num_attention_heads = 0;
  int num_key_value_heads = 0;
  // Raw values the loader may need later (heads, hidden size...), canonical JSON.
  std::string config_json;
};

// Reads <model_dir>/config.json. Missing file -> NOT_FOUND naming it; malformed JSON or a
// missing "architectures" -> INVALID_ARGUMENT naming the file and the field.
absl::StatusOr<ModelConfig> ReadModelConfig(const std::string& model_dir);

// Parses config.json text (for tests). `source` names it in errors.
absl::StatusOr<ModelConfig> ParseModelConfig(const std::string& json_text,
                                             const std::string& source);

// The quantization to serve for `spec` given the checkpoint's config: spec "auto" takes the
// config's; "fp8_block" on an unquantized checkpoint is online quantization (online = true,
// 128x128 blocks, canonical config OnlineFp8BlockConfig()); an explicit "none" on a quantized
// checkpoint is UNIMPLEMENTED with a clear message.
// Unsupported methods are UNIMPLEMENTED naming the method and kSupportedQuantizations.
// The canonical config of online fp8_block quantization, hashed into the fingerprint:
// {"activation_scheme":"dynamic","fmt":"e4m3","online":true,"quant_method":"fp8",
//  "quantized_layers":"linear-v1","weight_block_size":[128,128]}
// ("quantized_layers" names the rule of which tensors are quantized, pkg/load/plan.h;
// a change of that rule or of the maths changes this string or kLoaderFormatVersion.)
std::string OnlineFp8BlockConfig();

absl::StatusOr<Quantization> ResolveQuantization(const ModelSpec& spec, const ModelConfig& config);

}  // namespace weightcache::spec
