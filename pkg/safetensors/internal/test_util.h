// Test-only helpers for pkg/safetensors tests: a per-test temp dir and raw file writers.
// Thread-safety: use from the test's thread.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testutil/temp_dir.h"

namespace weightcache::safetensors::testing {

// A fresh directory, removed with everything in it (the project's one test temp dir).
using TempDir = ::weightcache::testing::TempDir;

inline std::string LengthBytes(uint64_t n) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((n >> (8 * i)) & 0xFF);
  return s;
}

inline void WriteBytes(const std::string& path, std::string_view bytes) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  ASSERT_GE(fd, 0) << path;
  ASSERT_EQ(::write(fd, bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
  ::close(fd);
}

// A safetensors file with `header` verbatim (its true length in the length field) and
// `data_bytes` bytes of data area (a repeating pattern).
inline void WriteRaw(const std::string& path, std::string_view header, size_t data_bytes = 0) {
  std::string bytes = LengthBytes(header.size());
  bytes.append(header);
  for (size_t i = 0; i < data_bytes; ++i) bytes.push_back(static_cast<char>(i * 7 + 1));
  WriteBytes(path, bytes);
}

inline std::vector<uint8_t> Pattern(size_t n, uint32_t seed) {
  std::vector<uint8_t> v(n);
  uint32_t x = seed * 2654435761u + 1;
  for (auto& b : v) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    b = static_cast<uint8_t>(x);
  }
  return v;
}

}  // namespace weightcache::safetensors::testing
