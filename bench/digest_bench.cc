// What content identity costs (docs/benchmarks.md, "Weights identity"):
//  - hashing a checkpoint file the first time a version is seen (pkg/identity HashFile:
//    parallel preads + SHA-256 per 64 MiB chunk) against plain parallel preads of the same
//    file with the same threads, page cache hot — the CPU cost of the hash on top of a read;
//  - a file's plain SHA-256, the identity a first sight waits for (identity::Sha256File: reader
//    threads run ahead of the hash) against one thread reading 4 MiB and hashing it in turn
//    (Sha256File before a87bdbc), page cache dropped (cold; needs root) and hot;
//  - the stale check of the Acquire path: stat() of a model's files (identity::StatPath +
//    DescribeChange, as OpenedModel::ChangedFiles does it).
//   digest_bench [--gib=4] [--dir=/tmp] [--files=1,4,64]
#include <fcntl.h>
#include <openssl/evp.h>
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

#include "bench/dense_checkpoint.h"
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

// One thread: a 4 MiB pread, then its SHA-256, in turn (Sha256File before a87bdbc).
std::string ReadThenHash(int fd, uint64_t size) {
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  if (ctx == nullptr || EVP_DigestInit_ex(ctx, EVP_sha256(), nullptr) != 1) std::abort();
  std::vector<unsigned char> buf(4u << 20);
  for (uint64_t off = 0; off < size;) {
    const ssize_t n = ::pread(fd, buf.data(), std::min<uint64_t>(buf.size(), size - off),
                              static_cast<off_t>(off));
    if (n <= 0 || EVP_DigestUpdate(ctx, buf.data(), static_cast<size_t>(n)) != 1) std::abort();
    off += static_cast<uint64_t>(n);
  }
  unsigned char d[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (EVP_DigestFinal_ex(ctx, d, &len) != 1) std::abort();
  EVP_MD_CTX_free(ctx);
  return std::string(reinterpret_cast<const char*>(d), len);
}

// The first sight's hash of `path`, cold and hot: best of 3 of each way, same bytes.
void PlainSha256Rows(const std::string& path, int fd, uint64_t size) {
  std::printf("\nPlain SHA-256 of the %.2f GB file (a first sight's identity), best of 3\n\n",
              size / 1e9);
  std::printf(
      "| page cache | one thread, read then hash in turn GB/s | Sha256File (reads ahead) "
      "GB/s | Sha256File / in turn |\n|---|--:|--:|--:|\n");
  for (const bool cold : {true, false}) {
    double turn_s = 1e9, ahead_s = 1e9;
    std::string how = "hot";
    for (int rep = 0; rep < 3; ++rep) {
      if (cold) how = bench::DropCache({path});
      auto t0 = Clock::now();
      ReadThenHash(fd, size);
      turn_s = std::min(turn_s, Since(t0));
      if (cold) bench::DropCache({path});
      t0 = Clock::now();
      if (!identity::Sha256File(fd, size, path).ok()) std::abort();
      ahead_s = std::min(ahead_s, Since(t0));
    }
    std::printf("| %s | %.2f | %.2f | %.2fx |\n", cold ? ("cold, " + how).c_str() : "hot",
                size / turn_s / 1e9, size / ahead_s / 1e9, turn_s / ahead_s);
  }
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

  PlainSha256Rows(path, fd.get(), size);

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
