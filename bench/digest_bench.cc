// What content identity costs (docs/benchmarks.md, "Weights identity"):
//  - hashing a checkpoint file the first time a version is seen (pkg/identity HashFile:
//    parallel preads + SHA-256 per 64 MiB chunk) against plain parallel preads of the same
//    file with the same threads, page cache hot — the CPU cost of the hash on top of a read;
//  - the stale check of the Acquire path: stat() of a model's files (identity::StatPath +
//    DescribeChange, as OpenedModel::ChangedFiles does it).
//   digest_bench [--gib=4] [--dir=/tmp] [--files=1,4,64]
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "pkg/identity/identity.h"
#include "pkg/util/scoped_fd.h"

using namespace weightcache;
using Clock = std::chrono::steady_clock;

namespace {

double Since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Plain parallel preads of the whole file in 4 MiB reads, `threads` workers.
double ReadAll(int fd, uint64_t size, unsigned threads) {
  constexpr uint64_t kRead = 4ull << 20;
  std::atomic<uint64_t> next{0};
  auto t0 = Clock::now();
  std::vector<std::thread> pool;
  for (unsigned i = 0; i < threads; ++i) {
    pool.emplace_back([&] {
      std::vector<char> buf(kRead);
      for (uint64_t off = next.fetch_add(kRead); off < size; off = next.fetch_add(kRead)) {
        if (::pread(fd, buf.data(), std::min(kRead, size - off), static_cast<off_t>(off)) <= 0) {
          std::abort();
        }
      }
    });
  }
  for (auto& t : pool) t.join();
  return Since(t0);
}

}  // namespace

int main(int argc, char** argv) {
  double gib = 4;
  std::string dir = "/tmp";
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--gib=", 6) == 0) gib = std::atof(argv[i] + 6);
    if (std::strncmp(argv[i], "--dir=", 6) == 0) dir = argv[i] + 6;
  }
  const uint64_t size = static_cast<uint64_t>(gib * (1ull << 30));
  const std::string path = dir + "/wc-digest-bench.bin";
  {
    // Random bytes (not zeros): the hash does the same work as on real weights.
    ScopedFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
    std::mt19937_64 rng(1);
    std::vector<uint64_t> block((16u << 20) / 8);
    for (uint64_t done = 0; done < size;) {
      for (auto& w : block) w = rng();
      const size_t n = static_cast<size_t>(std::min<uint64_t>(block.size() * 8, size - done));
      if (::write(fd.get(), block.data(), n) != static_cast<ssize_t>(n)) std::abort();
      done += n;
    }
  }
  ScopedFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  ReadAll(fd.get(), size, 4);  // page cache hot from here on
  const unsigned cpus = std::max(1u, std::thread::hardware_concurrency());
  std::printf("Content digest of a %.1f GiB file, page cache hot (%u CPUs)\n\n", gib, cpus);
  std::printf("| threads | pread GB/s | hash (pread + SHA-256) GB/s | hash / pread |\n");
  std::printf("|--------:|-----------:|-------------------------:|-------------:|\n");
  for (unsigned t : {1u, 2u, 4u, 8u, 16u}) {
    if (t > 2 * cpus) break;
    double read_s = 1e9, hash_s = 1e9;
    for (int rep = 0; rep < 3; ++rep) {
      read_s = std::min(read_s, ReadAll(fd.get(), size, t));
      auto t0 = Clock::now();
      auto d = identity::HashFile(fd.get(), size, t, path);
      if (!d.ok()) std::abort();
      hash_s = std::min(hash_s, Since(t0));
    }
    std::printf("| %7u | %10.2f | %24.2f | %11.0f%% |\n", t, size / read_s / 1e9,
                size / hash_s / 1e9, 100.0 * read_s / hash_s);
  }

  // The Acquire path's stale check: a stat() and a compare per file.
  std::printf("\nStale check (stat + compare per file), median of 2000\n\n");
  std::printf("| files | us per check |\n|------:|-------------:|\n");
  for (int files : {1, 4, 64, 163}) {
    std::vector<std::string> paths;
    std::vector<identity::FileStat> stats;
    for (int i = 0; i < files; ++i) {
      paths.push_back(dir + "/wc-digest-bench-" + std::to_string(i));
      ScopedFd f(::open(paths.back().c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
      stats.push_back(*identity::StatPath(paths.back()));
    }
    std::vector<double> us;
    for (int rep = 0; rep < 2000; ++rep) {
      auto t0 = Clock::now();
      size_t changed = 0;
      for (int i = 0; i < files; ++i) {
        changed += identity::DescribeChange("f", stats[i], identity::StatPath(paths[i])).size();
      }
      us.push_back(Since(t0) * 1e6);
      if (changed != 0) std::abort();
    }
    std::sort(us.begin(), us.end());
    std::printf("| %5d | %12.1f |\n", files, us[us.size() / 2]);
    for (const auto& p : paths) ::unlink(p.c_str());
  }
  ::unlink(path.c_str());
  return 0;
}
