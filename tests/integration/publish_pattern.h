// The tensors the publish tests publish and the bytes they hold: a function of a seed, so a
// reader in another process checks every byte without a copy of them.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "pkg/client/client.h"

namespace weightcache::testing {

inline client::EngineIdentity PatternIdentity(const std::string& recipe) {
  return {"testengine", "1.0", "none", recipe};
}

// Three tensors (5.25 MiB): two segments' worth of granules in one segment.
inline std::vector<client::PublishTensor> PatternTensors() {
  return {
      {"a.weight", safetensors::DType::kF32, {512, 1024}, 512u * 1024u * 4u},
      {"b.bias", safetensors::DType::kBF16, {1000}, 2000},
      {"c.packed", safetensors::DType::kU8, {3, 1u << 20}, 3u << 20},
  };
}

inline uint8_t PatternByte(const std::string& name, uint32_t seed, uint64_t i) {
  uint64_t h = seed * 0x9E3779B97F4A7C15ull + i * 0xBF58476D1CE4E5B9ull;
  for (char ch : name) h = (h ^ static_cast<uint8_t>(ch)) * 0x100000001B3ull;
  return static_cast<uint8_t>(h >> 56);
}

inline void FillPattern(const client::TensorView& v, uint32_t seed, void* data) {
  auto* out = static_cast<uint8_t*>(data);
  for (uint64_t i = 0; i < v.nbytes; ++i) out[i] = PatternByte(v.name, seed, i);
}

// The name of the first tensor whose bytes differ (or that is missing); empty when all equal.
inline std::string CheckPattern(const client::Lease& lease, uint32_t seed) {
  for (const auto& t : PatternTensors()) {
    const client::TensorView* v = lease.Find(t.name);
    if (v == nullptr || v->nbytes != t.nbytes || v->dtype != t.dtype || v->shape != t.shape) {
      return t.name;
    }
    const auto* in = static_cast<const uint8_t*>(v->data);
    for (uint64_t i = 0; i < v->nbytes; ++i) {
      if (in[i] != PatternByte(t.name, seed, i)) return t.name;
    }
  }
  return lease.tensors().size() == PatternTensors().size() ? "" : "(extra tensors)";
}

}  // namespace weightcache::testing
