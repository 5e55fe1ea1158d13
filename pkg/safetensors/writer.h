// Writes safetensors files: used by tests, the demo checkpoint generator and benchmarks.
// Thread-safety: free functions, no shared state.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "pkg/safetensors/safetensors.h"

namespace weightcache::safetensors {

struct TensorData {
  std::string name;
  DType dtype = DType::kBF16;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;  // numel * DTypeSize(dtype) bytes
};

// Writes one file with tensors laid out in the given order (8-byte aligned header, as the
// reference implementation pads it).
absl::Status WriteFile(const std::string& path, const std::vector<TensorData>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

// Demo/test checkpoint: a small Llama-shaped model with real tensor names, seeded values.
struct LlamaShape {
  int layers = 2;
  int hidden = 512;
  int intermediate = 1376;
  int heads = 8;
  int kv_heads = 4;
  int vocab = 8192;
  DType dtype = DType::kBF16;
  uint64_t seed = 42;
  int shards = 1;  // >1 writes model-0000i-of-0000n.safetensors + index json
};
// The smallest Llama the tests load (1 layer, hidden 64, vocab 128: ~100 KB in BF16), for
// suites that need a real checkpoint, not its size.
inline LlamaShape TinyLlama() {
  LlamaShape s;
  s.layers = 1;
  s.hidden = 64;
  s.intermediate = 128;
  s.heads = 2;
  s.kv_heads = 1;
  s.vocab = 128;
  return s;
}
// Writes config.json (LlamaForCausalLM) and the safetensors file(s) into `dir`.
absl::Status WriteLlamaCheckpoint(const std::string& dir, const LlamaShape& shape);

// Test checkpoints for the tensor-parallel presets: the real HF tensor names and shapes of
// one architecture, tiny sizes, seeded values (per tensor name, as above).
struct ArchShape {
  // LlamaForCausalLM, Qwen2ForCausalLM (q/k/v biases), Qwen3ForCausalLM (q/k norms),
  // Qwen3MoeForCausalLM, MixtralForCausalLM, DeepseekV3ForCausalLM (MLA, shared experts).
  std::string architecture = "LlamaForCausalLM";
  int layers = 2;
  int hidden = 256;
  int intermediate = 512;  // dense MLP
  int heads = 8;
  int kv_heads = 4;  // ignored by DeepseekV3 (MLA)
  int head_dim = 0;  // 0: hidden / heads
  int vocab = 1000;
  // Mixture of experts (Qwen3Moe, Mixtral, DeepseekV3).
  int experts = 4;
  int moe_intermediate = 256;
  int shared_experts = 1;  // DeepseekV3: n_shared_experts
  int first_dense = 1;     // DeepseekV3: first_k_dense_replace
  bool mtp = false;        // DeepseekV3: a multi-token-prediction layer after the last one
  // DeepseekV3 MLA.
  int q_lora_rank = 128;  // 0: no q_a/q_b, a plain q_proj (V2-Lite style)
  int kv_lora_rank = 128;
  int qk_nope_head_dim = 32;
  int qk_rope_head_dim = 32;
  int v_head_dim = 32;
  DType dtype = DType::kBF16;
  // Block-FP8 (DeepSeek-V3 style): linear weights F8_E4M3 with an F32 weight_scale_inv of
  // [ceil(out/block), ceil(in/block)], and quantization_config {quant_method: fp8,
  // weight_block_size: [block, block]}. Embeddings, norms and routers stay in `dtype`.
  bool fp8 = false;
  int block = 128;
  uint64_t seed = 42;
  int shards = 1;
};
struct TensorSpec {
  std::string name;
  DType dtype = DType::kBF16;
  std::vector<int64_t> shape;
};
// The tensors WriteArchCheckpoint writes, in file order; INVALID_ARGUMENT for an unknown
// architecture or bad sizes.
absl::StatusOr<std::vector<TensorSpec>> ArchTensors(const ArchShape& shape);
// Writes config.json and the safetensors file(s) into `dir`.
absl::Status WriteArchCheckpoint(const std::string& dir, const ArchShape& shape);

}  // namespace weightcache::safetensors
