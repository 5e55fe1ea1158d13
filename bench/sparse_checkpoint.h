// Sparse safetensors checkpoints for the Acquire benchmarks: the header of `tensors` BF16
// tensors with Llama-like names adding up to about `bytes`, the data area left as a hole
// (reads give zeros; the time to map does not depend on values).
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>

namespace weightcache::bench {

inline void WriteSparseCheckpoint(const std::string& dir, int tensors, uint64_t bytes) {
  std::filesystem::create_directories(dir);
  FILE* cfg = std::fopen((dir + "/config.json").c_str(), "w");
  std::fprintf(cfg, R"({"architectures":["LlamaForCausalLM"],"torch_dtype":"bfloat16"})");
  std::fclose(cfg);
  uint64_t per = std::max<uint64_t>(2, bytes / tensors / 2 * 2);  // bf16 elements * 2
  std::string header = "{";
  uint64_t off = 0;
  for (int i = 0; i < tensors; ++i) {
    char name[96];
    std::snprintf(name, sizeof name, "model.layers.%d.mlp.w%d.weight", i / 8, i % 8);
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
  ::close(fd);
}

}  // namespace weightcache::bench
