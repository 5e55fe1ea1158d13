// Opening a model for serving: config.json, the quantization allowlist, the checkpoint
// headers, the served dtype, and the fingerprint inputs for a layout and environment.
// Order matters: the allowlist is checked from config.json before any safetensors file
// is opened, so a refused quantization never costs a weight byte.
// Identity: every checkpoint file's content digest (pkg/identity) enters the fingerprint, and
// the file versions it was taken from are kept so a later change is seen with a few stat()s.
// Thread-safety: OpenedModel is immutable after OpenModel; share it freely.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "pkg/identity/identity.h"
#include "pkg/safetensors/safetensors.h"
#include "pkg/spec/fingerprint.h"
#include "pkg/spec/model_config.h"
#include "pkg/spec/spec.h"

namespace weightcache::load {

// One checkpoint file as identified when the model was opened.
struct SourceFile {
  std::string name;  // basename
  std::string path;
  identity::FileStat stat;  // the version `digest` describes
  std::string digest;       // "sha256:<hex>"; empty when digests were not asked
  // kPinned: `digest` is the spec's, not (yet) checked against the bytes on this node; the
  // loader checks it against the bytes it reads (internal::PinCheck). kStore/kHashed/kBlobName:
  // from the bytes.
  identity::DigestSource digest_source = identity::DigestSource::kHashed;
};

// What changed on disk since `files` were identified, one description per changed file
// ("model.safetensors: size 1 -> 2, modified ..."); empty when every file is as it was.
// A stat() per file, no reads.
std::vector<std::string> ChangedFiles(const std::vector<SourceFile>& files);

struct OpenedModel {
  spec::ModelSpec spec;
  spec::ModelConfig config;
  spec::Quantization quantization;
  std::string architecture;  // spec's, else config.json's
  std::string dtype;         // served dtype: "bf16", "fp16", "fp32", "fp8_e4m3"
  safetensors::Checkpoint checkpoint;
  std::vector<SourceFile> files;  // in checkpoint.files() order
  // Where the loader looks up and records the digests it checks pinned files against (the
  // daemon's store, which outlives every OpenedModel); null: a memory-only one per check.
  identity::DigestStore* digests = nullptr;
  bool pinned() const { return !spec.digests.empty(); }

  // Fingerprint inputs of this model served for `layout` in `env`.
  spec::FingerprintInputs Inputs(const spec::Layout& layout, const spec::Environment& env) const;
  // Whether this spec serves an entry with these inputs and fingerprint under its own name:
  // same tp/pp sizes, same content (the entry's layout and environment), and the same kind of
  // copy (a private spec's entries carry a namespace, a shared spec's none).
  bool Reproduces(const spec::FingerprintInputs& entry, const std::string& fingerprint) const;
  std::vector<std::string> ChangedFiles() const { return load::ChangedFiles(files); }
};

struct OpenOptions {
  // Content digests for the fingerprint. Off only for tools that compare bytes themselves
  // (weightcachectl verify) and never key a cache by the result.
  bool content_digests = true;
  // Remembers digests per file version (the daemon's, persisted); null: a private one.
  identity::DigestStore* digests = nullptr;
  unsigned hash_threads = 8;
  const std::atomic<bool>* cancel = nullptr;  // stops hashing (CANCELLED) when true
};

// Short dtype name used in fingerprints and the API for a safetensors dtype ("bf16").
std::string ShortDTypeName(safetensors::DType dtype);

// With pinned digests (spec `digests:`), no file is read for its digest: each is taken from
// the spec, unless the store already knows this file version by another SHA-256 (DATA_LOSS
// naming the file and both digests, before anything is loaded). A pin for a file that is not
// in the checkpoint, or a checkpoint file without one, is INVALID_ARGUMENT naming the model
// and the files.
absl::StatusOr<std::shared_ptr<const OpenedModel>> OpenModel(const spec::ModelSpec& spec,
                                                             const OpenOptions& options = {});

// Whether `status` is a refusal because a file hashes otherwise than its pinned digest (from
// a load, or OpenModel): a marker payload, so callers count it (metrics)
// without reading the message.
bool IsPinnedDigestMismatch(const absl::Status& status);

}  // namespace weightcache::load
