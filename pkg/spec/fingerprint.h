// Fingerprint: decides whether cached weights fit an engine. SHA-256 (hex) over a canonical
// encoding of the fields below; a mismatch is explained field by field.
// Thread-safety: plain values and pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace weightcache::spec {

// Bumped whenever the loader's output for the same inputs changes (packing, alignment,
// fused layouts, quantization maths).
// 2: weights identified by content digests, not by headers.
inline constexpr int kLoaderFormatVersion = 2;

struct FileDigest {
  std::string name;  // basename: a moved checkpoint still matches, a changed one does not
  uint64_t size = 0;
  // Digest of the file's whole contents (pkg/identity), always cryptographic: "sha256:<hex>"
  // (a Hugging Face blob, its name verified) or "sha256c:<hex>" hashed by the daemon. Two files
  // that differ in any byte differ here; the header alone does not tell a fine-tune from its base
  // model.
  std::string content;
};

struct Layout {
  int tp_size = 1;
  int tp_rank = 0;
  int pp_size = 1;
  int pp_rank = 0;
};

struct Environment {
  std::string compute_capability = "cpu";  // "cpu" or "sm_90"
  int loader_format_version = kLoaderFormatVersion;
  std::string engine;          // set for weights published by an engine
  std::string engine_version;  // e.g. "sglang 0.5.2 / torch 2.8"
  // Weights published by an engine only (encoded only when set, so the fingerprints of
  // loaded entries stay as they were): its framework's version and its processing recipe.
  std::string framework_version;  // e.g. "torch 2.8.0+cu128"
  std::string recipe;             // e.g. "fp8-blockscale-v3"
  // A private copy's Kubernetes namespace (spec `isolation: namespace`): set by the daemon
  // from the pod that asks, never by a client; encoded only when set, so shared entries keep
  // their fingerprints. Two namespaces' copies of one checkpoint are two entries.
  std::string tenant;
};

struct FingerprintInputs {
  // Model identity.
  std::string architecture;
  std::string revision;
  std::vector<FileDigest> files;  // any order; canonicalized by name
  // Layout.
  Layout layout;
  // Engine tensor layout (spec `layout`): "hf" (or empty, the same) | "sglang" | "vllm".
  // Encoded only when not "hf", so fingerprints from before this field stay the same.
  std::string tensor_layout = "hf";
  // Quantization and dtype.
  std::string quant_method = "none";
  std::string quant_config_sha256;
  std::string dtype;  // served dtype, e.g. "bf16"
  // Environment.
  Environment env;

  // Deterministic text encoding: one "field=value" line per field, files sorted by name.
  std::string Canonical() const;
  // Hex SHA-256 of Canonical().
  std::string Digest() const;
};

struct FieldDiff {
  std::string field;  // e.g. "tp_size", "files[model.safetensors].content"
  std::string cached;
  std::string asked;
};

// Every field that differs, in a stable order.
std::vector<FieldDiff> Diff(const FingerprintInputs& cached, const FingerprintInputs& asked);
// "tp_size: cached 8, asked 4; dtype: cached bf16, asked fp16"
std::string FormatDiff(const std::vector<FieldDiff>& diffs);

// Hex SHA-256 of arbitrary bytes (OpenSSL).
std::string Sha256Hex(const void* data, size_t size);

}  // namespace weightcache::spec
