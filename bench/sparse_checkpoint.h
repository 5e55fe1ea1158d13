// Sparse safetensors checkpoints for the Acquire benchmarks: the header of `tensors` BF16
// tensors with Llama-like names adding up to about `bytes`, the data area left as a hole
// (reads give zeros; the time to map does not depend on values) except for three stamps
// per tensor (StampAt): 256 bytes derived from the tensor's name at its start, middle and
// end, which an engine reads back through its mapping to check that every tensor landed
// where the manifest says (CheckStamps) -- a 120 GiB model fits no benchmark disk whole.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

namespace weightcache::bench {

constexpr uint64_t kStampBytes = 256;

// Offsets of the stamps in a tensor of `nbytes` (>= kStampBytes): start, middle, end.
inline std::array<uint64_t, 3> StampOffsets(uint64_t nbytes) {
  const uint64_t last = nbytes - kStampBytes;
  return {0, std::min(last, nbytes / 2 / kStampBytes * kStampBytes), last};
}

// The stamp `spot` (0..2) of tensor `name`: FNV-1a of the name and spot, then splitmix.
inline void StampAt(const std::string& name, int spot, uint8_t* out) {
  uint64_t h = 1469598103934665603ull ^ static_cast<uint64_t>(spot);
  for (char c : name) h = (h ^ static_cast<uint8_t>(c)) * 1099511628211ull;
  for (uint64_t i = 0; i < kStampBytes; i += 8) {
    uint64_t z = (h += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    std::memcpy(out + i, &z, 8);
  }
}

inline void WriteSparseCheckpoint(const std::string& dir, int tensors, uint64_t bytes) {
  std::filesystem::create_directories(dir);
  FILE* cfg = std::fopen((dir + "/config.json").c_str(), "w");
  std::fprintf(cfg, R"({"architectures":["LlamaForCausalLM"],"torch_dtype":"bfloat16"})");
  std::fclose(cfg);
  uint64_t per = std::max<uint64_t>(2, bytes / tensors / 2 * 2);  // bf16 elements * 2
  std::string header = "{";
  std::vector<std::string> names;
  uint64_t off = 0;
  for (int i = 0; i < tensors; ++i) {
    char name[96];
    std::snprintf(name, sizeof name, "model.layers.%d.mlp.w%d.weight", i / 8, i % 8);
    names.emplace_back(name);
    header += (i ? "," : "") + std::string("\"") + name + "\":{\"dtype\":\"BF16\",\"shape\":[" +
              std::to_string(per / 2) + "],\"data_offsets\":[" + std::to_string(off) + "," +
              std::to_string(off + per) + "]}";
    off += per;
  }
  header += "}";
  while ((header.size() + 8) % 8 != 0) header += ' ';
  int fd = ::open((dir + "/model.safetensors").c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0644);
  uint64_t n = header.size();
  (void)!::write(fd, &n, 8);
  (void)!::write(fd, header.data(), header.size());
  (void)!::ftruncate(fd, static_cast<off_t>(8 + header.size() + off));
  if (per >= kStampBytes) {
    uint8_t stamp[kStampBytes];
    for (size_t i = 0; i < names.size(); ++i) {
      const auto spots = StampOffsets(per);
      for (int k = 0; k < 3; ++k) {
        StampAt(names[i], k, stamp);
        (void)!::pwrite(fd, stamp, kStampBytes,
                        static_cast<off_t>(8 + header.size() + i * per + spots[k]));
      }
    }
  }
  ::close(fd);
}

}  // namespace weightcache::bench
