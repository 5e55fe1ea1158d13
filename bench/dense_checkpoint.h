// Dense Llama-shaped checkpoints for benchmarks that read them from disk (load_bench,
// peer_fill_bench): the tensor names and shapes of Llama-3-8B, layers chosen for the size,
// BF16 values drawn at random (no zero pages, nothing compressible), sharded like HF
// (<= 5 GB per file); and the page cache of their files, measured and dropped ("cold").
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "pkg/safetensors/writer.h"

namespace weightcache::bench {

inline uint64_t SplitMix(uint64_t& x) {
  uint64_t z = (x += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Random BF16 of magnitude 2^-7..2 with either sign: ~12 random bits per value.
void FillBf16(uint8_t* p, uint64_t n, uint64_t seed) {
  uint64_t s = seed;
  auto* q = reinterpret_cast<uint16_t*>(p);
  for (uint64_t i = 0; i < n / 2; i += 4) {
    uint64_t r = SplitMix(s);
    for (int k = 0; k < 4 && i + k < n / 2; ++k) {
      auto v = static_cast<uint16_t>(r >> (16 * k));
      uint16_t exp = static_cast<uint16_t>(120 + ((v >> 8) & 7));
      q[i + k] = static_cast<uint16_t>((v & 0x8000) | (exp << 7) | (v & 0x7F));
    }
  }
}

// A dense Llama checkpoint written by WriteDenseLlama.
struct Checkpoint {
  std::string dir;
  std::vector<std::string> files;
  uint64_t bytes = 0;  // tensor bytes
  uint64_t file_bytes = 0;
  int layers = 0;
};

inline std::string Json(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) absl::StrAppend(&s, i ? "," : "", v[i]);
  return s + "]";
}

// `max_shard_bytes`: files of at most this many tensor bytes (HF's 5 GB unless told).
inline absl::StatusOr<Checkpoint> WriteDenseLlama(const std::string& dir, double gib,
                                                  uint64_t max_shard_bytes = 5'000'000'000ull) {
  safetensors::ArchShape shape;
  shape.architecture = "LlamaForCausalLM";
  shape.hidden = 4096;
  shape.intermediate = 14336;
  shape.heads = 32;
  shape.kv_heads = 8;
  shape.vocab = 128256;
  const double per_layer = 2.0 * (2 * 4096.0 * 4096 + 2 * 1024.0 * 4096 + 3 * 4096.0 * 14336);
  const double fixed = 2.0 * 2 * 128256.0 * 4096;
  shape.layers =
      std::max(1, static_cast<int>(std::lround((gib * (1ull << 30) - fixed) / per_layer)));
  auto specs = safetensors::ArchTensors(shape);
  if (!specs.ok()) return specs.status();
  Checkpoint c;
  c.dir = dir;
  c.layers = shape.layers;
  ::mkdir(dir.substr(0, dir.rfind('/')).c_str(), 0755);
  ::mkdir(dir.c_str(), 0755);
  // Shards of at most max_shard_bytes, in tensor order (as HF's save_pretrained cuts
  // them).
  std::vector<std::vector<size_t>> shards(1);
  uint64_t in_shard = 0;
  std::vector<uint64_t> nbytes;
  for (size_t i = 0; i < specs->size(); ++i) {
    uint64_t n = 2;
    for (int64_t d : (*specs)[i].shape) n *= static_cast<uint64_t>(d);
    nbytes.push_back(n);
    if (in_shard > 0 && in_shard + n > max_shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(i);
    in_shard += n;
  }
  std::string weight_map;
  for (size_t k = 0; k < shards.size(); ++k) {
    std::string name = absl::StrFormat("model-%05d-of-%05d.safetensors", k + 1, shards.size());
    std::string header = R"({"__metadata__":{"format":"pt"})";
    uint64_t off = 0;
    for (size_t i : shards[k]) {
      const auto& t = (*specs)[i];
      absl::StrAppend(&header, ",\"", t.name, R"(":{"dtype":"BF16","shape":)", Json(t.shape),
                      R"(,"data_offsets":[)", off, ",", off + nbytes[i], "]}");
      absl::StrAppend(&weight_map, weight_map.empty() ? "" : ",\n", "    \"", t.name, "\": \"",
                      name, "\"");
      off += nbytes[i];
    }
    header += "}";
    while (header.size() % 8 != 0) header += ' ';  // 8-byte aligned, as the reference pads
    const std::string path = dir + "/" + name;
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return absl::InternalError(path + ": " + std::strerror(errno));
    uint64_t hlen = header.size();
    std::string head(reinterpret_cast<const char*>(&hlen), 8);
    head += header;
    if (::pwrite(fd, head.data(), head.size(), 0) != static_cast<ssize_t>(head.size())) {
      ::close(fd);
      return absl::InternalError(path + ": write header");
    }
    // Data in 64 MiB blocks, generated and written by 16 threads.
    const uint64_t base = head.size(), block = 64ull << 20;
    std::atomic<uint64_t> next{0};
    std::atomic<bool> bad{false};
    std::vector<std::thread> th;
    for (int t = 0; t < 16; ++t) {
      th.emplace_back([&, t] {
        std::vector<uint8_t> buf(block);
        for (;;) {
          uint64_t at = next.fetch_add(block);
          if (at >= off) return;
          uint64_t n = std::min(block, off - at);
          FillBf16(buf.data(), n, (k << 40) ^ at ^ 0x5eed);
          if (::pwrite(fd, buf.data(), n, static_cast<off_t>(base + at)) !=
              static_cast<ssize_t>(n)) {
            bad = true;
            return;
          }
        }
        (void)t;
      });
    }
    for (auto& x : th) x.join();
    if (bad) {
      ::close(fd);
      return absl::InternalError(path + ": write failed (disk full?)");
    }
    ::fsync(fd);
    ::close(fd);
    c.files.push_back(path);
    c.bytes += off;
    c.file_bytes += base + off;
  }
  std::string config = absl::StrFormat(
      R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
 "intermediate_size": 14336, "num_attention_heads": 32, "num_key_value_heads": 8,
 "num_hidden_layers": %d, "head_dim": 128, "vocab_size": 128256, "torch_dtype": "bfloat16",
 "rms_norm_eps": 1e-05, "hidden_act": "silu", "max_position_embeddings": 8192,
 "rope_theta": 500000.0, "attention_bias": false, "tie_word_embeddings": false}
)",
      shape.layers);
  FILE* f = std::fopen((dir + "/config.json").c_str(), "w");
  std::fputs(config.c_str(), f);
  std::fclose(f);
  f = std::fopen((dir + "/model.safetensors.index.json").c_str(), "w");
  std::fprintf(f,
               "{\n  \"metadata\": {\"total_size\": %llu},\n  \"weight_map\": "
               "{\n%s\n  }\n}\n",
               static_cast<unsigned long long>(c.bytes), weight_map.c_str());
  std::fclose(f);
  return c;
}

// Deletes what WriteDenseLlama wrote.
inline void RemoveCheckpoint(const Checkpoint& c) {
  for (const auto& f : c.files) ::unlink(f.c_str());
  ::unlink((c.dir + "/config.json").c_str());
  ::unlink((c.dir + "/model.safetensors.index.json").c_str());
  ::rmdir(c.dir.c_str());
}

// The page cache.

inline double Resident(const std::vector<std::string>& files) {
  uint64_t pages = 0, in = 0;
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  for (const auto& p : files) {
    int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
    struct stat st {};
    ::fstat(fd, &st);
    auto size = static_cast<uint64_t>(st.st_size);
    void* m = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
    std::vector<unsigned char> v((size + page - 1) / page);
    if (m != MAP_FAILED && ::mincore(m, size, v.data()) == 0) {
      for (unsigned char c : v) in += c & 1;
      pages += v.size();
    }
    if (m != MAP_FAILED) ::munmap(m, size);
    ::close(fd);
  }
  return pages == 0 ? -1 : static_cast<double>(in) / static_cast<double>(pages);
}

// Parallel preads of every byte of `files` (O_DIRECT or through the page cache), in GB/s:
// the storage's own rate when cold.
inline double RawRead(const std::vector<std::string>& files, bool direct, unsigned threads,
                      uint64_t chunk) {
  struct Job {
    int fd;
    uint64_t off, len;
  };
  std::vector<int> fds;
  std::vector<Job> jobs;
  for (const auto& p : files) {
    int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC | (direct ? O_DIRECT : 0));
    if (fd < 0) {
      std::fprintf(stderr, "%s: open: %s\n", p.c_str(), std::strerror(errno));
      std::exit(1);
    }
    fds.push_back(fd);
    struct stat st {};
    ::fstat(fd, &st);
    for (uint64_t o = 0; o < static_cast<uint64_t>(st.st_size); o += chunk) {
      jobs.push_back({fd, o, std::min<uint64_t>(chunk, st.st_size - o)});
    }
  }
  std::atomic<size_t> next{0};
  std::atomic<uint64_t> got{0};
  auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> th;
  for (unsigned t = 0; t < threads; ++t) {
    th.emplace_back([&] {
      void* buf = std::aligned_alloc(4096, chunk);
      for (size_t i; (i = next.fetch_add(1)) < jobs.size();) {
        const Job& j = jobs[i];
        uint64_t len = direct ? (j.len + 4095) / 4096 * 4096 : j.len;
        ssize_t n = ::pread(j.fd, buf, len, static_cast<off_t>(j.off));
        if (n < 0) {
          std::fprintf(stderr, "pread: %s\n", std::strerror(errno));
          std::exit(1);
        }
        got += static_cast<uint64_t>(n);
      }
      std::free(buf);
    });
  }
  for (auto& x : th) x.join();
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (int fd : fds) ::close(fd);
  return static_cast<double>(got.load()) / 1e9 / s;
}

// Empties the page cache of `files`; returns the method that worked.
inline std::string DropCache(const std::vector<std::string>& files) {
  ::sync();
  int fd = ::open("/proc/sys/vm/drop_caches", O_WRONLY | O_CLOEXEC);
  bool dropped = fd >= 0 && ::write(fd, "3", 1) == 1;
  if (fd >= 0) ::close(fd);
  if (dropped && Resident(files) < 0.01) return "drop_caches";
  for (const auto& p : files) {
    int f = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
    ::posix_fadvise(f, 0, 0, POSIX_FADV_DONTNEED);
    ::close(f);
  }
  double r = Resident(files);
  return r < 0.01 ? "fadvise" : absl::StrFormat("FAILED (%.0f%% resident)", 100 * r);
}

}  // namespace weightcache::bench
