// Helpers shared by the GPU tests and the helper binary: a deterministic byte pattern, and
// the few CUDA runtime calls the tests make (kernel write, device->host copy, pinned memory),
// kept in gpu_testkit.cu so no CUDA header reaches the C++ test sources.
// Thread-safety: the CUDA helpers use the runtime's per-thread current device.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace weightcache::gputest {

inline uint64_t SplitMix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// The pattern of segment `seg` under `seed`: 8-byte words, word i = SplitMix64(seed, seg, i).
inline void FillPattern(void* dst, size_t n, uint64_t seed, uint32_t seg) {
  auto* p = static_cast<unsigned char*>(dst);
  for (size_t off = 0; off < n; off += 8) {
    uint64_t w = SplitMix64(seed ^ (uint64_t{seg} << 48) ^ (off / 8));
    std::memcpy(p + off, &w, std::min<size_t>(8, n - off));
  }
}
// Offset of the first byte that differs from the pattern, or -1 when all `n` match.
inline int64_t FirstMismatch(const void* src, size_t n, uint64_t seed, uint32_t seg) {
  const auto* p = static_cast<const unsigned char*>(src);
  for (size_t off = 0; off < n; off += 8) {
    uint64_t w = SplitMix64(seed ^ (uint64_t{seg} << 48) ^ (off / 8));
    size_t k = std::min<size_t>(8, n - off);
    if (std::memcmp(p + off, &w, k) != 0) return static_cast<int64_t>(off);
  }
  return -1;
}

// Each returns "" on success, else the CUDA runtime error name (e.g. "cudaErrorIllegalAddress").
// Writes 0xFF over [p, p+n) with a kernel on device `ordinal` and waits for it.
std::string KernelWrite(void* p, size_t n, int ordinal);
// cudaMemcpy device->host on device `ordinal`.
std::string CopyToHost(void* dst, const void* src, size_t n, int ordinal);
// Page-locked host memory (cudaHostAlloc) for the asynchronous copy path.
std::string PinnedAlloc(void** p, size_t n);
void PinnedFree(void* p);
// Sum over the bytes of [p, p+n) of byte * (i % 251 + 1), computed by a kernel on `ordinal`.
std::string DeviceChecksum(const void* p, size_t n, int ordinal, uint64_t* sum);
inline uint64_t HostChecksum(const void* p, size_t n) {
  const auto* b = static_cast<const unsigned char*>(p);
  uint64_t s = 0;
  for (size_t i = 0; i < n; ++i) s += static_cast<uint64_t>(b[i]) * (i % 251 + 1);
  return s;
}
// DeviceChecksum in two halves: the kernel is launched (asynchronously) and starts reading
// only `delay_ms` after it begins; FinishChecksum waits for it and frees `result`.
std::string StartDelayedChecksum(const void* p, size_t n, int ordinal, double delay_ms,
                                 unsigned long long** result);
std::string FinishChecksum(int ordinal, unsigned long long* result, uint64_t* sum);
// cudaMemGetInfo on `ordinal` (creates this process's context if needed).
std::string MemInfo(int ordinal, uint64_t* free_bytes, uint64_t* total_bytes);

}  // namespace weightcache::gputest
