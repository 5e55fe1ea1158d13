// Writes safetensors files: used by tests, the demo checkpoint generator and benchmarks.
// Thread-safety: free functions, no shared state.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
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
// Writes config.json (LlamaForCausalLM) and the safetensors file(s) into `dir`.
absl::Status WriteLlamaCheckpoint(const std::string& dir, const LlamaShape& shape);

}  // namespace weightcache::safetensors
