// Model spec: the typed, versioned description of what the daemon loads. Parsed once from
// YAML or JSON (a file holding one spec or a list under `models:`) or from flags, validated,
// then passed around as this struct. Thread-safety: plain values.
//
// Example (YAML, version 1):
//   version: 1
//   name: llama-8b
//   model_dir: /models/llama-8b
//   architecture: LlamaForCausalLM   # optional: read from config.json
//   revision: main                   # optional
//   tp_size: 1
//   tp_ranks: [0]                    # optional: default all ranks
//   pp_size: 1
//   pp_rank: 0
//   dtype: auto                      # auto = as stored; bf16 | fp16 | fp32
//   quantization: auto               # auto = from config.json; none | fp8_block
//   layout: hf                       # hf = tensors as in the checkpoint; sglang | vllm also
//                                    # pack q/k/v and gate/up shards contiguously, add the
//                                    # engine's fused views (qkv_proj, gate_up_proj...) and
//                                    # pad the vocabulary to a multiple of 64 as they do
//   allowed_namespaces: [team-a]     # optional: only pods of these Kubernetes namespaces may
//                                    # map it (daemon --namespace_rules); empty: everyone
//   isolation: shared                # optional: shared (one copy for every namespace that
//                                    # may map it) | namespace (a private copy per namespace,
//                                    # needs --namespace_rules; docs/security.md)
//   publishers: [team-a, uid:1000]   # optional: who may publish for it (compile artifacts,
//                                    # published weights): namespaces of pods on slot
//                                    # sockets, uid:<n> on the engine socket; admins always;
//                                    # empty: every granted publisher
//   native_publishers: [team-a]      # optional: who may publish native code for it (kinds
//                                    # the engine dlopens: aoti-package) besides admins;
//                                    # empty: admins only
//   digests:                         # optional: each checkpoint file's SHA-256 (64 hex
//     model.safetensors: 9f86d0...   # digits; `weightcachectl pin` prints the block), by
//                                    # file name: the daemon names the weights by them
//                                    # without reading the files, and a load from disk
//                                    # refuses a file whose bytes hash otherwise
//   segment_digests:                 # optional: per fingerprint, each segment's sha256-tree
//     3f2a...: [9c1d..., 77e0...]    # root (weightcachectl pin); a peer fill of it is
//                                    # served only with these
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace weightcache::spec {

inline constexpr int kSpecVersion = 1;

// Limits on spec text, checked before it is parsed (a spec arrives in a Load RPC too): its
// size, the nesting of lists and mappings (a spec needs 4: models, list, spec, tp_ranks) and
// the number of values (a spec has about 15; a daemon's list of a thousand models is far
// below). Input beyond them is INVALID_ARGUMENT naming the limit.
inline constexpr size_t kMaxSpecBytes = 1 << 20;
inline constexpr size_t kMaxSpecDepth = 16;
inline constexpr size_t kMaxSpecNodes = 100'000;

// Spec `isolation` values.
inline constexpr char kIsolationShared[] = "shared";
inline constexpr char kIsolationNamespace[] = "namespace";

struct ModelSpec {
  int version = kSpecVersion;
  std::string name;          // [a-z0-9][a-z0-9._-]{0,62}: also a metrics label
  std::string model_dir;     // holds config.json and the safetensors file(s)
  std::string architecture;  // empty: config.json "architectures"[0]
  std::string revision;      // free text, part of the model identity
  int tp_size = 1;
  std::vector<int> tp_ranks;  // empty: all ranks 0..tp_size-1
  int pp_size = 1;
  int pp_rank = 0;
  std::string dtype = "auto";         // auto | bf16 | fp16 | fp32
  std::string quantization = "auto";  // auto | none | fp8_block
  std::string layout = "hf";          // hf | sglang | vllm (see the example above)
  // Who may map the weights (an access rule, not weights identity: it never enters the
  // fingerprint). Kubernetes namespace names (DNS-1123 labels, unique); empty: everyone.
  // Enforced by the daemon only with --namespace_rules (docs/security.md).
  std::vector<std::string> allowed_namespaces;
  // "shared": one copy serves every namespace that may map the model. "namespace": each
  // Kubernetes namespace gets its own copy (entries per fingerprint and namespace, each
  // counted in the budget), for teams that will not share memory that any holder of the
  // descriptors could write (docs/security.md). Needs the daemon's --namespace_rules.
  std::string isolation = kIsolationShared;
  bool Private() const { return isolation == kIsolationNamespace; }
  // Who may publish for the model (its compile artifacts, which are code its engines run,
  // and published weights), besides admins: Kubernetes namespace names (a pod's, on its
  // slot socket) and "uid:<n>" (a peer on the engine socket); unique. Empty: every granted
  // publisher. An access rule: never in the fingerprint.
  std::vector<std::string> publishers;
  // Who may publish native code for the model (artifact kinds the engine loads with dlopen:
  // artifact::IsNativeCode), besides admins; the same forms as `publishers`, which do not
  // open native code. Empty: admins only. An access rule: never in the fingerprint.
  std::vector<std::string> native_publishers;
  // Pinned digests: checkpoint file name (a basename, e.g. "model-00001-of-00002.safetensors")
  // -> the SHA-256 of its whole contents, 64 lowercase hex digits (ParseSpecs lowercases).
  // Empty: the daemon computes them (pkg/identity). When set, every file of the checkpoint
  // needs one and each must name a file of it (checked when the model is opened, since the
  // spec alone does not list the files: load::OpenModel); they give the content identity
  // without a read, and a load from disk refuses bytes that hash otherwise. Part of the
  // fingerprint only through the content digests they stand for (the same as hashing gives).
  std::map<std::string, std::string> digests;
  // Pinned segment digests (issue 48): fingerprint (64 hex digits) -> each segment's
  // cryptographic digest (pkg/integrity/crypto_digest.h, sha256-tree v1; 64 lowercase hex
  // digits), in segment order, as `weightcachectl pin` prints them for the fingerprints a
  // node holds. A peer fill of that fingerprint is served only with these segment digests
  // (docs/peer-fill.md, "Anchors"). Never in the fingerprint.
  std::map<std::string, std::vector<std::string>> segment_digests;
};

// Whether `digest` is a SHA-256 as a spec pins it: exactly 64 lowercase hex digits.
bool IsSha256Hex(const std::string& digest);

// Whether `name` is a Kubernetes namespace name: a DNS-1123 label, [a-z0-9]([-a-z0-9]*[a-z0-9])?
// of at most 63 characters.
bool IsNamespaceName(const std::string& name);

// Validates field ranges and names; INVALID_ARGUMENT naming the field otherwise. Free-text
// fields (model_dir up to 4096 bytes, architecture and revision up to 256) must be UTF-8
// without control characters.
absl::Status Validate(const ModelSpec& spec);

// Parses YAML or JSON text (JSON is YAML). `source` names the input in errors.
// Accepts a single spec mapping, or a mapping with `models:` holding a list of them.
// Unknown keys and a version other than kSpecVersion are errors, and so is text beyond the
// limits above. Values echoed in errors are escaped and cut (QuoteTruncated).
absl::StatusOr<std::vector<ModelSpec>> ParseSpecs(const std::string& text,
                                                  const std::string& source);
absl::StatusOr<std::vector<ModelSpec>> LoadSpecFile(const std::string& path);

// Parses the flag form: comma-separated key=value, e.g.
// "name=llama,model_dir=/m/llama,tp_size=1,tp_ranks=0". Keys as in YAML, but for `digests`
// (a mapping: spec files and inline Load specs only).
absl::StatusOr<ModelSpec> ParseSpecFlag(const std::string& flag);

// Renders a spec as canonical YAML (round-trips through ParseSpecs).
std::string ToYaml(const ModelSpec& spec);

}  // namespace weightcache::spec
