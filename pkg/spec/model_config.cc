#include "pkg/spec/model_config.h"

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "pkg/spec/fingerprint.h"
#include "pkg/spec/internal/read_file.h"
#include "pkg/util/status_macros.h"
#include "pkg/util/untrusted_text.h"

namespace weightcache::spec {
namespace {

using Json = nlohmann::json;

// Dumps with sorted keys (nlohmann's default object is a std::map), no whitespace, and never
// throws: the parser has already rejected invalid UTF-8, and `replace` covers the rest.
std::string CanonicalJson(const Json& j) {
  return j.dump(-1, ' ', /*ensure_ascii=*/false, Json::error_handler_t::replace);
}

// A config value in a message: its JSON, cut when long.
std::string Brief(const Json& j) {
  std::string s = CanonicalJson(j);
  if (s.size() > kMaxQuotedBytes) s = absl::StrCat(s.substr(0, kMaxQuotedBytes), "...");
  return s;
}

// Deepest nesting accepted in config.json (real ones nest 3 or 4 levels).
constexpr size_t kMaxConfigDepth = 64;

absl::Status NotServed(const std::string& what) {
  return absl::UnimplementedError(
      absl::StrCat(what, " is not served (supported: ", kSupportedQuantizations, ")"));
}

bool IsServed(const std::string& method) { return method == "none" || method == "fp8_block"; }

// Classifies config.json's quantization_config against the allowlist.
// Messages name fields, not the file: the caller prefixes the source.
absl::StatusOr<Quantization> ParseQuantization(const Json& root) {
  Quantization q;
  auto it = root.find("quantization_config");
  if (it == root.end() || it->is_null()) return q;  // unquantized checkpoint
  const Json& qc = *it;
  if (!qc.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("quantization_config: must be an object, got ", qc.type_name()));
  }
  auto method_it = qc.find("quant_method");
  if (method_it == qc.end() || !method_it->is_string()) {
    return NotServed("quantization_config without a quant_method string");
  }
  const std::string method = method_it->get<std::string>();
  if (method != "fp8") {
    // awq, gptq, marlin, gptq_marlin, awq_marlin, bitsandbytes, compressed-tensors, unknown:
    // their layout lives partly outside the raw tensors, so a mapped copy computes garbage.
    return NotServed(absl::StrCat("quantization '", EscapeTruncated(method), "'"));
  }
  auto block_it = qc.find("weight_block_size");
  if (block_it == qc.end() || block_it->is_null()) {
    return NotServed(
        "quantization 'fp8' with per-tensor scales (no weight_block_size in "
        "quantization_config)");
  }
  const Json& block = *block_it;
  bool block_ok = block.is_array() && block.size() == 2;
  for (size_t i = 0; block_ok && i < block.size(); ++i) {
    block_ok = block[i].is_number_integer() && block[i].get<int64_t>() > 0 &&
               block[i].get<int64_t>() <= (int64_t{1} << 20);
  }
  if (!block_ok) {
    return absl::InvalidArgumentError(
        absl::StrCat("quantization_config.weight_block_size: must be a list of 2 positive "
                     "integers, got ",
                     Brief(block)));
  }
  q.method = "fp8_block";
  q.weight_block_size = {block[0].get<int>(), block[1].get<int>()};
  q.canonical_config = CanonicalJson(qc);
  q.config_sha256 = Sha256Hex(q.canonical_config.data(), q.canonical_config.size());
  return q;
}

}  // namespace

absl::StatusOr<ModelConfig> ParseModelConfig(const std::string& json_text,
                                             const std::string& source) {
  if (BracketNestingDepth(json_text, kMaxConfigDepth) > kMaxConfigDepth) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": nests arrays/objects deeper than ",
                                                   kMaxConfigDepth, " levels (refused unparsed)"));
  }
  Json root;
  try {
    root = Json::parse(json_text);
  } catch (const Json::exception& e) {
    // nlohmann quotes the offending token, which may be the whole input.
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": malformed JSON: ", EscapeTruncated(e.what(), 256)));
  }
  if (!root.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": must hold a JSON object, got ", root.type_name()));
  }

  ModelConfig config;
  auto arch = root.find("architectures");
  if (arch == root.end()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": architectures: missing"));
  }
  if (!arch->is_array() || arch->empty() || !(*arch)[0].is_string() ||
      (*arch)[0].get<std::string>().empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        source, ": architectures: must be a non-empty list of strings, got ", Brief(*arch)));
  }
  config.architecture = (*arch)[0].get<std::string>();

  // Newer transformers write "dtype"; older ones "torch_dtype".
  for (const char* key : {"torch_dtype", "dtype"}) {
    auto it = root.find(key);
    if (it == root.end() || it->is_null()) continue;
    if (!it->is_string()) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": ", key, ": must be a string, got ", Brief(*it)));
    }
    config.torch_dtype = it->get<std::string>();
    break;
  }

  // Optional positive integers; absent or null keeps 0.
  for (auto [key, out] :
       {std::pair<const char*, int*>{"num_attention_heads", &config.num_attention_heads},
        std::pair<const char*, int*>{"num_key_value_heads", &config.num_key_value_heads}}) {
    auto it = root.find(key);
    if (it == root.end() || it->is_null()) continue;
    if (!it->is_number_integer() || it->get<int64_t>() < 1 || it->get<int64_t>() > (1 << 20)) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": ", key, ": must be a positive integer, got ", Brief(*it)));
    }
    *out = static_cast<int>(it->get<int64_t>());
  }
  if (config.num_key_value_heads == 0) config.num_key_value_heads = config.num_attention_heads;

  auto quantization = ParseQuantization(root);
  if (!quantization.ok()) return Annotate(quantization.status(), source);
  config.quantization = *std::move(quantization);
  config.config_json = CanonicalJson(root);
  return config;
}

absl::StatusOr<ModelConfig> ReadModelConfig(const std::string& model_dir) {
  const std::string path = model_dir + "/config.json";
  WC_ASSIGN_OR_RETURN(std::string text, internal::ReadTextFile(path));
  return ParseModelConfig(text, path);
}

std::string OnlineFp8BlockConfig() {
  Json j = {{"quant_method", "fp8"},
            {"fmt", "e4m3"},
            {"activation_scheme", "dynamic"},
            {"weight_block_size", {kOnlineFp8Block, kOnlineFp8Block}},
            {"online", true},
            {"quantized_layers", "linear-v1"}};
  return CanonicalJson(j);
}

absl::StatusOr<Quantization> ResolveQuantization(const ModelSpec& spec, const ModelConfig& config) {
  const Quantization& stored = config.quantization;
  const std::string who = spec.name.empty() ? spec.model_dir : spec.name;
  if (!IsServed(stored.method)) {
    return Annotate(NotServed(absl::StrCat("quantization '", EscapeTruncated(stored.method), "'")),
                    who);
  }
  if (spec.quantization == "auto" || spec.quantization == stored.method) return stored;
  if (spec.quantization == "none") {
    return absl::UnimplementedError(absl::StrCat(
        who, ": quantization 'none' asked, but the checkpoint is quantized as '", stored.method,
        "'; weightcache serves quantized checkpoints as stored and does not "
        "dequantize them (use quantization: auto)"));
  }
  if (spec.quantization == "fp8_block" && stored.method == "none") {
    // Online: weightcache quantizes the linear weights while loading (pkg/load).
    Quantization q;
    q.method = "fp8_block";
    q.weight_block_size = {kOnlineFp8Block, kOnlineFp8Block};
    q.online = true;
    q.canonical_config = OnlineFp8BlockConfig();
    q.config_sha256 = Sha256Hex(q.canonical_config.data(), q.canonical_config.size());
    return q;
  }
  return Annotate(NotServed(absl::StrCat("quantization '", spec.quantization, "'")), who);
}

}  // namespace weightcache::spec
