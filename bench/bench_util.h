// Small helpers shared by the benchmark programs: flag lists, percentiles, times, and the
// JSON lines that bench/run-all collects into one results.jsonl (bench/plot_benchmarks.py
// reads them; the keys each bench writes are listed there and in docs/benchmarks.md).
// Single-threaded use; nothing here is a library API.
#pragma once

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"

namespace weightcache::bench {

using Clock = std::chrono::steady_clock;

inline double Ms(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

// "1,8,64" -> {1, 8, 64}.
inline std::vector<double> ParseList(const char* s) {
  std::vector<double> v;
  for (const char* p = s; *p != '\0';) {
    v.push_back(std::atof(p));
    const char* c = std::strchr(p, ',');
    if (c == nullptr) break;
    p = c + 1;
  }
  return v;
}

// Nearest-rank percentile (p in [0, 1]) of a non-empty sample.
inline double Percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(std::lround(p * (v.size() - 1))))];
}

// Appends `row` as one line to `path` (no-op when `path` is empty). Returns false, with a
// message on stderr, when the file cannot be written.
inline bool AppendJsonLine(const std::string& path, const nlohmann::json& row) {
  if (path.empty()) return true;
  FILE* f = std::fopen(path.c_str(), "a");
  if (f == nullptr) {
    std::fprintf(stderr, "--json=%s: %s\n", path.c_str(), std::strerror(errno));
    return false;
  }
  const std::string line = row.dump() + "\n";
  const bool ok = std::fwrite(line.data(), 1, line.size(), f) == line.size();
  return std::fclose(f) == 0 && ok;
}

}  // namespace weightcache::bench
