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
  auto shard_name = [&](size_t k) {
    return n == 1 ? std::string("model.safetensors")
                  : absl::StrFormat("model-%05d-of-%05d.safetensors", k + 1, n);
  };

  nlohmann::ordered_json weight_map = nlohmann::ordered_json::object();
  size_t i = 0;
  for (size_t k = 0; k < n; ++k) {
    std::vector<TensorData> tensors;
    for (; i < plan.size() && shard_of[i] == k; ++i) {
      TensorData t;
      t.name = plan[i].name;
      t.dtype = shape.dtype;
      t.shape = plan[i].shape;
      uint64_t numel = 1;
      for (int64_t d : t.shape) numel *= static_cast<uint64_t>(d);
      t.bytes = RandomTensorBytes(shape.dtype, numel, shape.seed, t.name);
      weight_map[t.name] = shard_name(k);
      tensors.push_back(std::move(t));
    }
    WC_RETURN_IF_ERROR(WriteFile(dir + "/" + shard_name(k), tensors, {{"format", "pt"}}));
  }
  if (n > 1) {
    nlohmann::ordered_json index = {{"metadata", {{"total_size", total}}},
                                    {"weight_map", std::move(weight_map)}};
    WC_RETURN_IF_ERROR(WriteText(dir + "/model.safetensors.index.json", index.dump(2) + "\n"));
  }
  return absl::OkStatus();
}

}  // namespace weightcache::safetensors
