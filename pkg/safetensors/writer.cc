// WriteFile and WriteLlamaCheckpoint: safetensors output for tests, demos and benchmarks.
#include "pkg/safetensors/writer.h"

#include <fcntl.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"
#include "pkg/safetensors/internal/io.h"
#include "pkg/util/errno_status.h"
#include "pkg/util/scoped_fd.h"
#include "pkg/util/status_macros.h"

namespace weightcache::safetensors {
namespace {

using OrderedJson = nlohmann::ordered_json;

absl::StatusOr<ScopedFd> CreateFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoStatus(errno, "open", path);
  return ScopedFd(fd);
}

absl::Status WriteText(const std::string& path, const std::string& text) {
  WC_ASSIGN_OR_RETURN(ScopedFd fd, CreateFile(path));
  WC_RETURN_IF_ERROR(internal::WriteAll(fd.get(), text.data(), text.size(), path));
  if (::close(fd.release()) != 0) return ErrnoStatus(errno, "close", path);
  return absl::OkStatus();
}

uint64_t SplitMix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t Fnv1a(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

// Uniform in [-0.05, 0.05): small, finite, like an initialised weight.
float SmallFloat(uint32_t bits24) {
  return (static_cast<float>(bits24) * (1.0f / 16777216.0f) - 0.5f) * 0.1f;
}

uint16_t FloatToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  u += 0x7FFF + ((u >> 16) & 1);  // round to nearest even (inputs are finite and small)
  return static_cast<uint16_t>(u >> 16);
}

// IEEE half with a random sign and mantissa and magnitude in [2^-8, 2^-2): finite, normal.
uint16_t RandomHalf(uint16_t r) {
  const uint16_t exponent = static_cast<uint16_t>(7 + ((r >> 10) % 6));  // 7..12, bias 15
  return static_cast<uint16_t>((r & 0x8000) | (exponent << 10) | (r & 0x3FF));
}

// Deterministic values for one tensor: seeded by the checkpoint seed and the tensor's
// name, so the bytes of a tensor do not depend on how the checkpoint is sharded.
std::vector<uint8_t> RandomTensorBytes(DType dtype, uint64_t numel, uint64_t seed,
                                       const std::string& name) {
  std::vector<uint8_t> out(numel * DTypeSize(dtype));
  uint64_t state = seed ^ Fnv1a(name);
  switch (dtype) {
    case DType::kBF16: {
      for (uint64_t i = 0; i < numel; i += 2) {
        const uint64_t r = SplitMix64(state);
        const uint16_t v[2] = {FloatToBf16(SmallFloat(static_cast<uint32_t>(r) >> 8)),
                               FloatToBf16(SmallFloat(static_cast<uint32_t>(r >> 40)))};
        std::memcpy(out.data() + 2 * i, v, std::min<uint64_t>(2, numel - i) * 2);
      }
      break;
    }
    case DType::kF16: {
      for (uint64_t i = 0; i < numel; i += 4) {
        const uint64_t r = SplitMix64(state);
        uint16_t v[4];
        for (int k = 0; k < 4; ++k) v[k] = RandomHalf(static_cast<uint16_t>(r >> (16 * k)));
        std::memcpy(out.data() + 2 * i, v, std::min<uint64_t>(4, numel - i) * 2);
      }
      break;
    }
    case DType::kF32: {
      for (uint64_t i = 0; i < numel; i += 2) {
        const uint64_t r = SplitMix64(state);
        const float v[2] = {SmallFloat(static_cast<uint32_t>(r) >> 8),
                            SmallFloat(static_cast<uint32_t>(r >> 40))};
        std::memcpy(out.data() + 4 * i, v, std::min<uint64_t>(2, numel - i) * 4);
      }
      break;
    }
    default: {  // raw bytes
      for (size_t i = 0; i < out.size(); i += 8) {
        const uint64_t r = SplitMix64(state);
        std::memcpy(out.data() + i, &r, std::min<size_t>(8, out.size() - i));
      }
      break;
    }
  }
  return out;
}

absl::StatusOr<std::string_view> TorchDtype(DType dtype) {
  switch (dtype) {
    case DType::kBF16:
      return "bfloat16";
    case DType::kF16:
      return "float16";
    case DType::kF32:
      return "float32";
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("WriteLlamaCheckpoint: dtype ", std::string(DTypeName(dtype)),
                       " is not a float dtype a Llama checkpoint is stored in (BF16, F16, F32)"));
  }
}

struct PlannedTensor {
  std::string name;
  std::vector<int64_t> shape;
};

std::vector<PlannedTensor> LlamaTensors(const LlamaShape& s) {
  const int64_t head_dim = s.hidden / s.heads;
  const int64_t h = s.hidden;
  const int64_t kv = s.kv_heads * head_dim;
  std::vector<PlannedTensor> t;
  t.push_back({"model.embed_tokens.weight", {s.vocab, h}});
  for (int i = 0; i < s.layers; ++i) {
    const std::string p = absl::StrCat("model.layers.", i, ".");
    t.push_back({p + "input_layernorm.weight", {h}});
    t.push_back({p + "self_attn.q_proj.weight", {h, h}});
    t.push_back({p + "self_attn.k_proj.weight", {kv, h}});
    t.push_back({p + "self_attn.v_proj.weight", {kv, h}});
    t.push_back({p + "self_attn.o_proj.weight", {h, h}});
    t.push_back({p + "post_attention_layernorm.weight", {h}});
    t.push_back({p + "mlp.gate_proj.weight", {s.intermediate, h}});
    t.push_back({p + "mlp.up_proj.weight", {s.intermediate, h}});
    t.push_back({p + "mlp.down_proj.weight", {h, s.intermediate}});
  }
  t.push_back({"model.norm.weight", {h}});
  t.push_back({"lm_head.weight", {s.vocab, h}});
  return t;
}

}  // namespace

absl::Status WriteFile(const std::string& path, const std::vector<TensorData>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  OrderedJson header = OrderedJson::object();
  if (!metadata.empty()) {
    OrderedJson meta = OrderedJson::object();
    for (const auto& [k, v] : metadata) meta[k] = v;
    header["__metadata__"] = std::move(meta);
  }
  std::set<std::string_view> names;
  uint64_t offset = 0;
  for (const TensorData& t : tensors) {
    if (t.name == "__metadata__" || !names.insert(t.name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": tensor name '", t.name, "' is reserved or given twice"));
    }
    uint64_t numel = 1;
    for (int64_t d : t.shape) {
      if (d < 0 || __builtin_mul_overflow(numel, static_cast<uint64_t>(d), &numel)) {
        return absl::InvalidArgumentError(
            absl::StrCat(path, ": tensor '", t.name, "': bad shape dimension ", d));
      }
    }
    uint64_t nbytes = 0;
    if (__builtin_mul_overflow(numel, DTypeSize(t.dtype), &nbytes) || nbytes != t.bytes.size()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": tensor '", t.name, "': shape needs ",
                                                     numel, " x ", DTypeSize(t.dtype),
                                                     " bytes but ", t.bytes.size(), " were given"));
    }
    header[t.name] = OrderedJson{{"dtype", std::string(DTypeName(t.dtype))},
                                 {"shape", t.shape},
                                 {"data_offsets", {offset, offset + nbytes}}};
    offset += nbytes;
  }
  std::string text = header.dump();
  // Like the reference implementation: pad with spaces so the data area starts 8-aligned.
  text.append((8 - text.size() % 8) % 8, ' ');
  unsigned char length[8];
  for (int i = 0; i < 8; ++i) length[i] = static_cast<unsigned char>(text.size() >> (8 * i));

  WC_ASSIGN_OR_RETURN(ScopedFd fd, CreateFile(path));
  WC_RETURN_IF_ERROR(internal::WriteAll(fd.get(), length, sizeof length, path));
  WC_RETURN_IF_ERROR(internal::WriteAll(fd.get(), text.data(), text.size(), path));
  for (const TensorData& t : tensors) {
    WC_RETURN_IF_ERROR(internal::WriteAll(fd.get(), t.bytes.data(), t.bytes.size(), path));
  }
  if (::close(fd.release()) != 0) return ErrnoStatus(errno, "close", path);
  return absl::OkStatus();
}

namespace {

// Writes `tensors` (random bytes from `seed` and each name) into `n` shards named as
// save_pretrained names them -- tensor i into shard shard_of[i], a non-decreasing
// 0..n-1 -- and, when n > 1, model.safetensors.index.json.
absl::Status WriteShards(const std::string& dir, const std::vector<TensorSpec>& tensors,
                         const std::vector<size_t>& shard_of, size_t n, uint64_t seed) {
  auto shard_name = [&](size_t k) {
    return n == 1 ? std::string("model.safetensors")
                  : absl::StrFormat("model-%05d-of-%05d.safetensors", k + 1, n);
  };
  nlohmann::ordered_json weight_map = nlohmann::ordered_json::object();
  uint64_t total = 0;
  size_t i = 0;
  for (size_t k = 0; k < n; ++k) {
    std::vector<TensorData> shard;
    for (; i < tensors.size() && shard_of[i] == k; ++i) {
      TensorData t;
      t.name = tensors[i].name;
      t.dtype = tensors[i].dtype;
      t.shape = tensors[i].shape;
      uint64_t numel = 1;
      for (int64_t d : t.shape) numel *= static_cast<uint64_t>(d);
      t.bytes = RandomTensorBytes(t.dtype, numel, seed, t.name);
      total += t.bytes.size();
      weight_map[t.name] = shard_name(k);
      shard.push_back(std::move(t));
    }
    WC_RETURN_IF_ERROR(WriteFile(dir + "/" + shard_name(k), shard, {{"format", "pt"}}));
  }
  if (n > 1) {
    nlohmann::ordered_json index = {{"metadata", {{"total_size", total}}},
                                    {"weight_map", std::move(weight_map)}};
    WC_RETURN_IF_ERROR(WriteText(dir + "/model.safetensors.index.json", index.dump(2) + "\n"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status WriteLlamaCheckpoint(const std::string& dir, const LlamaShape& shape) {
  if (shape.layers < 0 || shape.hidden <= 0 || shape.intermediate <= 0 || shape.heads <= 0 ||
      shape.kv_heads <= 0 || shape.vocab <= 0 || shape.hidden % shape.heads != 0 ||
      shape.heads % shape.kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "WriteLlamaCheckpoint: bad shape: layers=%d hidden=%d intermediate=%d heads=%d "
        "kv_heads=%d vocab=%d (need positive sizes, heads | hidden, kv_heads | heads)",
        shape.layers, shape.hidden, shape.intermediate, shape.heads, shape.kv_heads, shape.vocab));
  }
  WC_ASSIGN_OR_RETURN(std::string_view torch_dtype, TorchDtype(shape.dtype));
  const std::vector<PlannedTensor> plan = LlamaTensors(shape);
  if (shape.shards < 1 || static_cast<size_t>(shape.shards) > plan.size()) {
    return absl::InvalidArgumentError(absl::StrCat("WriteLlamaCheckpoint: shards=", shape.shards,
                                                   " must be in [1, ", plan.size(), "]"));
  }
  if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
    return ErrnoStatus(errno, "mkdir", dir);
  }

  nlohmann::ordered_json config = {
      {"architectures", {"LlamaForCausalLM"}},
      {"model_type", "llama"},
      {"hidden_size", shape.hidden},
      {"intermediate_size", shape.intermediate},
      {"num_attention_heads", shape.heads},
      {"num_key_value_heads", shape.kv_heads},
      {"num_hidden_layers", shape.layers},
      {"head_dim", shape.hidden / shape.heads},
      {"vocab_size", shape.vocab},
      {"torch_dtype", std::string(torch_dtype)},
      {"rms_norm_eps", 1e-5},
      {"hidden_act", "silu"},
      {"max_position_embeddings", 4096},
      {"rope_theta", 10000.0},
      {"attention_bias", false},
      {"tie_word_embeddings", false},
      {"initializer_range", 0.02},
      {"bos_token_id", 1},
      {"eos_token_id", 2},
  };
  WC_RETURN_IF_ERROR(WriteText(dir + "/config.json", config.dump(2) + "\n"));

  // Contiguous groups of tensors in order, cut near equal byte counts; no shard is empty.
  const size_t elem = DTypeSize(shape.dtype);
  uint64_t total = 0;
  for (const PlannedTensor& t : plan) {
    uint64_t numel = 1;
    for (int64_t d : t.shape) numel *= static_cast<uint64_t>(d);
    total += numel * elem;
  }
  const auto n = static_cast<size_t>(shape.shards);
  std::vector<size_t> shard_of(plan.size());
  {
    uint64_t start = 0;
    size_t prev = 0;
    for (size_t i = 0; i < plan.size(); ++i) {
      size_t want = static_cast<size_t>(static_cast<long double>(start) * n / total);
      want = std::clamp(want, prev, prev + (i == 0 ? 0 : 1));
      want = std::max(want, n - std::min(n, plan.size() - i));  // leave none empty
      shard_of[i] = want;
      prev = want;
      uint64_t numel = 1;
      for (int64_t d : plan[i].shape) numel *= static_cast<uint64_t>(d);
      start += numel * elem;
    }
  }
  std::vector<TensorSpec> specs;
  specs.reserve(plan.size());
  for (const PlannedTensor& t : plan) specs.push_back({t.name, shape.dtype, t.shape});
  return WriteShards(dir, specs, shard_of, n, shape.seed);
}

// ---- Architecture checkpoints for the tensor-parallel presets ----

namespace {

struct ArchTensor {
  TensorSpec spec;
  bool linear = false;  // quantized to block FP8 when ArchShape::fp8
};

void Add(std::vector<ArchTensor>* out, std::string name, std::vector<int64_t> shape,
         bool linear = false) {
  out->push_back({{std::move(name), DType::kBF16, std::move(shape)}, linear});
}

void AddGatedMlp(std::vector<ArchTensor>* t, const std::string& p, int64_t h, int64_t inter) {
  Add(t, p + "gate_proj.weight", {inter, h}, true);
  Add(t, p + "up_proj.weight", {inter, h}, true);
  Add(t, p + "down_proj.weight", {h, inter}, true);
}

absl::StatusOr<std::vector<ArchTensor>> ArchTensorList(const ArchShape& s) {
  const std::string& a = s.architecture;
  const bool llama = a == "LlamaForCausalLM", qwen2 = a == "Qwen2ForCausalLM",
             qwen3 = a == "Qwen3ForCausalLM", qwen3moe = a == "Qwen3MoeForCausalLM",
             mixtral = a == "MixtralForCausalLM", deepseek = a == "DeepseekV3ForCausalLM";
  if (!(llama || qwen2 || qwen3 || qwen3moe || mixtral || deepseek)) {
    return absl::InvalidArgumentError(
        absl::StrCat("WriteArchCheckpoint: no generator for architecture '", a, "'"));
  }
  if (s.layers < 1 || s.hidden <= 0 || s.heads <= 0 || s.kv_heads <= 0 || s.vocab <= 0 ||
      s.intermediate <= 0 || s.experts < 0 || s.moe_intermediate <= 0 || s.block <= 0 ||
      (s.head_dim == 0 && s.hidden % s.heads != 0) || s.heads % s.kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "WriteArchCheckpoint: bad shape for %s: layers=%d hidden=%d heads=%d kv_heads=%d", a,
        s.layers, s.hidden, s.heads, s.kv_heads));
  }
  const int64_t h = s.hidden;
  const int64_t hd = s.head_dim > 0 ? s.head_dim : s.hidden / s.heads;
  std::vector<ArchTensor> t;
  Add(&t, "model.embed_tokens.weight", {s.vocab, h});
  const int total_layers = s.layers + (deepseek && s.mtp ? 1 : 0);
  for (int i = 0; i < total_layers; ++i) {
    const std::string p = absl::StrCat("model.layers.", i, ".");
    if (deepseek && i == s.layers) {  // the multi-token-prediction layer
      Add(&t, p + "embed_tokens.weight", {s.vocab, h});
      Add(&t, p + "enorm.weight", {h});
      Add(&t, p + "hnorm.weight", {h});
      Add(&t, p + "eh_proj.weight", {h, 2 * h});
      Add(&t, p + "shared_head.norm.weight", {h});
      Add(&t, p + "shared_head.head.weight", {s.vocab, h});
    }
    Add(&t, p + "input_layernorm.weight", {h});
    Add(&t, p + "post_attention_layernorm.weight", {h});
    if (deepseek) {
      const int64_t qk = s.qk_nope_head_dim + s.qk_rope_head_dim;
      if (s.q_lora_rank > 0) {
        Add(&t, p + "self_attn.q_a_proj.weight", {s.q_lora_rank, h}, true);
        Add(&t, p + "self_attn.q_a_layernorm.weight", {s.q_lora_rank});
        Add(&t, p + "self_attn.q_b_proj.weight", {s.heads * qk, s.q_lora_rank}, true);
      } else {
        Add(&t, p + "self_attn.q_proj.weight", {s.heads * qk, h}, true);
      }
      Add(&t, p + "self_attn.kv_a_proj_with_mqa.weight", {s.kv_lora_rank + s.qk_rope_head_dim, h},
          true);
      Add(&t, p + "self_attn.kv_a_layernorm.weight", {s.kv_lora_rank});
      Add(&t, p + "self_attn.kv_b_proj.weight",
          {s.heads * (s.qk_nope_head_dim + s.v_head_dim), s.kv_lora_rank}, true);
      Add(&t, p + "self_attn.o_proj.weight", {h, s.heads * s.v_head_dim}, true);
    } else {
      Add(&t, p + "self_attn.q_proj.weight", {s.heads * hd, h}, true);
      Add(&t, p + "self_attn.k_proj.weight", {s.kv_heads * hd, h}, true);
      Add(&t, p + "self_attn.v_proj.weight", {s.kv_heads * hd, h}, true);
      Add(&t, p + "self_attn.o_proj.weight", {h, s.heads * hd}, true);
      if (qwen2) {
        Add(&t, p + "self_attn.q_proj.bias", {s.heads * hd});
        Add(&t, p + "self_attn.k_proj.bias", {s.kv_heads * hd});
        Add(&t, p + "self_attn.v_proj.bias", {s.kv_heads * hd});
      }
      if (qwen3 || qwen3moe) {
        Add(&t, p + "self_attn.q_norm.weight", {hd});
        Add(&t, p + "self_attn.k_norm.weight", {hd});
      }
    }
    const bool moe = (qwen3moe || mixtral || (deepseek && i >= s.first_dense)) && s.experts > 0;
    if (!moe) {
      AddGatedMlp(&t, p + "mlp.", h, s.intermediate);
    } else if (mixtral) {
      Add(&t, p + "block_sparse_moe.gate.weight", {s.experts, h});
      for (int e = 0; e < s.experts; ++e) {
        const std::string q = absl::StrCat(p, "block_sparse_moe.experts.", e, ".");
        Add(&t, q + "w1.weight", {s.moe_intermediate, h}, true);
        Add(&t, q + "w2.weight", {h, s.moe_intermediate}, true);
        Add(&t, q + "w3.weight", {s.moe_intermediate, h}, true);
      }
    } else {
      Add(&t, p + "mlp.gate.weight", {s.experts, h});
      if (deepseek) {
        t.push_back({{p + "mlp.gate.e_score_correction_bias", DType::kF32, {s.experts}}, false});
        AddGatedMlp(&t, p + "mlp.shared_experts.", h,
                    static_cast<int64_t>(s.moe_intermediate) * s.shared_experts);
      }
      for (int e = 0; e < s.experts; ++e) {
        AddGatedMlp(&t, absl::StrCat(p, "mlp.experts.", e, "."), h, s.moe_intermediate);
      }
    }
  }
  Add(&t, "model.norm.weight", {h});
  Add(&t, "lm_head.weight", {s.vocab, h});

  std::vector<ArchTensor> out;
  for (auto& x : t) {
    if (x.spec.dtype == DType::kBF16) x.spec.dtype = s.dtype;
    if (s.fp8 && x.linear) {
      x.spec.dtype = DType::kF8_E4M3;
      const int64_t rows = (x.spec.shape[0] + s.block - 1) / s.block;
      const int64_t cols = (x.spec.shape[1] + s.block - 1) / s.block;
      std::string scale = x.spec.name.substr(0, x.spec.name.size() - 6) + "weight_scale_inv";
      out.push_back(x);
      out.push_back({{std::move(scale), DType::kF32, {rows, cols}}, false});
      continue;
    }
    out.push_back(std::move(x));
  }
  return out;
}

nlohmann::ordered_json ArchConfig(const ArchShape& s, std::string_view torch_dtype) {
  const std::string& a = s.architecture;
  const int hd = s.head_dim > 0 ? s.head_dim : s.hidden / s.heads;
  std::string model_type = a == "LlamaForCausalLM"      ? "llama"
                           : a == "Qwen2ForCausalLM"    ? "qwen2"
                           : a == "Qwen3ForCausalLM"    ? "qwen3"
                           : a == "Qwen3MoeForCausalLM" ? "qwen3_moe"
                           : a == "MixtralForCausalLM"  ? "mixtral"
                                                        : "deepseek_v3";
  nlohmann::ordered_json c = {
      {"architectures", {a}},
      {"model_type", model_type},
      {"hidden_size", s.hidden},
      {"intermediate_size", s.intermediate},
      {"num_attention_heads", s.heads},
      {"num_key_value_heads", a == "DeepseekV3ForCausalLM" ? s.heads : s.kv_heads},
      {"num_hidden_layers", s.layers},
      {"head_dim", hd},
      {"vocab_size", s.vocab},
      {"torch_dtype", std::string(torch_dtype)},
      {"rms_norm_eps", 1e-6},
      {"tie_word_embeddings", false},
  };
  if (a == "Qwen2ForCausalLM") c["attention_bias"] = true;
  if (a == "Qwen3MoeForCausalLM") {
    c["num_experts"] = s.experts;
    c["moe_intermediate_size"] = s.moe_intermediate;
    c["num_experts_per_tok"] = std::min(2, s.experts);
  }
  if (a == "MixtralForCausalLM") {
    c["num_local_experts"] = s.experts;
    c["intermediate_size"] = s.moe_intermediate;
    c["num_experts_per_tok"] = std::min(2, s.experts);
  }
  if (a == "DeepseekV3ForCausalLM") {
    c["n_routed_experts"] = s.experts;
    c["n_shared_experts"] = s.shared_experts;
    c["moe_intermediate_size"] = s.moe_intermediate;
    c["first_k_dense_replace"] = s.first_dense;
    c["q_lora_rank"] =
        s.q_lora_rank > 0 ? nlohmann::ordered_json(s.q_lora_rank) : nlohmann::ordered_json(nullptr);
    c["kv_lora_rank"] = s.kv_lora_rank;
    c["qk_nope_head_dim"] = s.qk_nope_head_dim;
    c["qk_rope_head_dim"] = s.qk_rope_head_dim;
    c["v_head_dim"] = s.v_head_dim;
    c["num_nextn_predict_layers"] = s.mtp ? 1 : 0;
  }
  if (s.fp8) {
    c["quantization_config"] = {{"activation_scheme", "dynamic"},
                                {"fmt", "e4m3"},
                                {"quant_method", "fp8"},
                                {"weight_block_size", {s.block, s.block}}};
  }
  return c;
}

}  // namespace

absl::StatusOr<std::vector<TensorSpec>> ArchTensors(const ArchShape& shape) {
  WC_ASSIGN_OR_RETURN(std::vector<ArchTensor> list, ArchTensorList(shape));
  std::vector<TensorSpec> out;
  out.reserve(list.size());
  for (auto& t : list) out.push_back(std::move(t.spec));
  return out;
}

absl::Status WriteArchCheckpoint(const std::string& dir, const ArchShape& shape) {
  WC_ASSIGN_OR_RETURN(std::string_view torch_dtype, TorchDtype(shape.dtype));
  WC_ASSIGN_OR_RETURN(std::vector<TensorSpec> plan, ArchTensors(shape));
  if (shape.shards < 1 || static_cast<size_t>(shape.shards) > plan.size()) {
    return absl::InvalidArgumentError(absl::StrCat("WriteArchCheckpoint: shards=", shape.shards,
                                                   " must be in [1, ", plan.size(), "]"));
  }
  if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
    return ErrnoStatus(errno, "mkdir", dir);
  }
  WC_RETURN_IF_ERROR(
      WriteText(dir + "/config.json", ArchConfig(shape, torch_dtype).dump(2) + "\n"));

  // Contiguous groups of about equal tensor counts, one per shard.
  const auto n = static_cast<size_t>(shape.shards);
  std::vector<size_t> shard_of(plan.size());
  for (size_t k = 0, next = 0; k < n; ++k) {
    for (const size_t end = plan.size() * (k + 1) / n; next < end; ++next) shard_of[next] = k;
  }
  return WriteShards(dir, plan, shard_of, n, shape.seed);
}

}  // namespace weightcache::safetensors
