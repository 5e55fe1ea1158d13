// Opening a model for serving: config.json, the quantization allowlist, the checkpoint
// headers, the served dtype, and the fingerprint inputs for a layout and environment.
// Order matters: the allowlist is checked from config.json before any safetensors file
// is opened, so a refused quantization never costs a weight byte.
// Thread-safety: OpenedModel is immutable after OpenModel; share it freely.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "pkg/safetensors/safetensors.h"
#include "pkg/spec/fingerprint.h"
#include "pkg/spec/model_config.h"
#include "pkg/spec/spec.h"

namespace weightcache::load {

struct OpenedModel {
  spec::ModelSpec spec;
  spec::ModelConfig config;
  spec::Quantization quantization;
  std::string architecture;  // spec's, else config.json's
  std::string dtype;         // served dtype: "bf16", "fp16", "fp32", "fp8_e4m3"
  safetensors::Checkpoint checkpoint;

  // Fingerprint inputs of this model served for `layout` in `env`.
  spec::FingerprintInputs Inputs(const spec::Layout& layout, const spec::Environment& env) const;
};

// Short dtype name used in fingerprints and the API for a safetensors dtype ("bf16").
std::string ShortDTypeName(safetensors::DType dtype);

absl::StatusOr<std::shared_ptr<const OpenedModel>> OpenModel(const spec::ModelSpec& spec);

}  // namespace weightcache::load
