// What a peer-fill pull moves through pkg/peer/ucx_transfer (issue 30): one process, a
// UcxServer exposing a buffer and a UcxPuller reading it whole, over TCP loopback by default
// (UCX_TLS=tcp unless set), GB/s per chunk size and window. Every pull's bytes are checked
// against the pattern. The server answers each request with a copy of the bytes asked for
// (docs/peer-fill.md, "Why the transport is not RMA over TCP"); this measures what that
// costs against the raw UCX figures of bench/ucx_transfer_bench.
//
//   peer_pull_bench [--bytes=1073741824] [--reps=3] [--chunks=1,4,16] [--windows=1,4,8]
//   (chunks in MiB; --chunks_kib=256,512 gives them in KiB instead)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "pkg/peer/ucx_transfer.h"

namespace {

std::vector<uint64_t> ParseList(const std::string& s) {
  std::vector<uint64_t> out;
  size_t pos = 0;
  while (pos <= s.size()) {
    const size_t comma = std::min(s.find(',', pos), s.size());
    out.push_back(std::stoull(s.substr(pos, comma - pos)));
    pos = comma + 1;
  }
  return out;
}

int Main(int argc, char** argv) {
  uint64_t bytes = 1ull << 30;
  int reps = 3;
  std::vector<uint64_t> chunks = {1024, 4096, 16384}, windows = {1, 4, 8};  // chunks in KiB
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const size_t eq = a.find('=');
    const std::string k = a.substr(0, eq), v = eq == std::string::npos ? "" : a.substr(eq + 1);
    if (k == "--bytes") {
      bytes = std::stoull(v);
    } else if (k == "--reps") {
      reps = std::stoi(v);
    } else if (k == "--chunks") {
      chunks = ParseList(v);
      for (auto& c : chunks) c <<= 10;
    } else if (k == "--chunks_kib") {
      chunks = ParseList(v);
    } else if (k == "--windows") {
      windows = ParseList(v);
    } else {
      std::fprintf(stderr, "peer_pull_bench: unknown flag %s\n", a.c_str());
      return 2;
    }
  }
  if (bytes == 0 || bytes % 8 != 0 || reps < 1) {
    std::fprintf(stderr,
                 "peer_pull_bench: --bytes must be a positive multiple of 8, --reps >= 1\n");
    return 2;
  }
  ::setenv("UCX_TLS", "tcp", 0);
  std::vector<uint64_t> src(bytes / 8), dst(bytes / 8);
  for (uint64_t i = 0; i < src.size(); ++i) src[i] = i * 0x9E3779B97F4A7C15ull;
  auto server = weightcache::peer::UcxServer::Start();
  auto puller = weightcache::peer::UcxPuller::Create();
  if (!server.ok() || !puller.ok()) {
    std::fprintf(stderr, "peer_pull_bench: UCX: %s\n",
                 std::string((server.ok() ? puller.status() : server.status()).message()).c_str());
    return 1;
  }
  auto region = (*server)->Expose(src.data(), bytes);
  if (!region.ok()) return 1;
  std::printf("Pull of %.2f GiB through UcxServer/UcxPuller (UCX_TLS=%s), median of %d\n\n",
              static_cast<double>(bytes) / (1 << 30), std::getenv("UCX_TLS"), reps);
  std::printf("| chunk KiB | window | GB/s | busy replies |\n|---:|---:|---:|---:|\n");
  for (uint64_t c : chunks) {
    for (uint64_t w : windows) {
      weightcache::peer::PullOptions o;
      o.chunk_bytes = c << 10;
      o.inflight = static_cast<unsigned>(w);
      o.timeout = std::chrono::minutes(10);
      std::vector<double> gbps;
      const uint64_t busy0 = (*server)->busy_replies();
      for (int r = 0; r < reps; ++r) {
        std::fill(dst.begin(), dst.end(), 0);
        const auto t0 = std::chrono::steady_clock::now();
        const absl::Status s =
            (*puller)->Pull((*server)->worker_address(), region->token, 0, dst.data(), bytes, o);
        const double sec =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (!s.ok()) {
          std::fprintf(stderr, "peer_pull_bench: pull: %s\n", std::string(s.message()).c_str());
          return 1;
        }
        if (dst != src) {
          std::fprintf(stderr, "peer_pull_bench: the pulled bytes differ from the source\n");
          return 1;
        }
        gbps.push_back(static_cast<double>(bytes) / sec / 1e9);
      }
      std::sort(gbps.begin(), gbps.end());
      std::printf("| %llu | %llu | %.2f | %llu |\n", static_cast<unsigned long long>(c),
                  static_cast<unsigned long long>(w), gbps[gbps.size() / 2],
                  static_cast<unsigned long long>((*server)->busy_replies() - busy0));
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return Main(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "peer_pull_bench: bad flag value: %s\n", e.what());
    return 2;
  }
}
