// Acquire -> mapped time on the host backend, as an engine sees it: a daemon (in this
// process, real sockets) serves a preloaded model; a client connects, acquires, receives the
// segment FDs on the handle channel, maps them and builds its tensor views. Prints a table.
//   acquire_bench [--reps=N] [--max_gib=4] [--tensors=N] [--json=FILE]
// --json appends one line per row: {"bench":"acquire","backend":"host","size_gib","tensors",
// "ms_p50","ms_min","ms_max","ms_p90","reps","segments","rpc_tensors_ms","rpc_packed_ms"}:
// the last two time the bare Acquire RPC with the manifest as `tensors` and packed.
// Checkpoints are sparse files (zeros): the time measured does not depend on the values.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "bench/raw_rpc.h"
#include "bench/sparse_checkpoint.h"
#include "pkg/client/client.h"
#include "pkg/memory/backend.h"
#include "pkg/server/daemon.h"
#include "pkg/spec/spec.h"

using namespace weightcache;
using bench::Percentile;

int main(int argc, char** argv) {
  int reps = 50;
  double max_gib = 4;
  int only_tensors = 0;  // --tensors=N: just the cases with N tensors
  std::string json;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--reps=", 7) == 0) reps = std::atoi(argv[i] + 7);
    if (std::strncmp(argv[i], "--max_gib=", 10) == 0) max_gib = std::atof(argv[i] + 10);
    if (std::strncmp(argv[i], "--tensors=", 10) == 0) only_tensors = std::atoi(argv[i] + 10);
    if (std::strncmp(argv[i], "--json=", 7) == 0) json = argv[i] + 7;
  }
  struct Case {
    int tensors;
    uint64_t bytes;
  };
  std::vector<Case> cases = {{100, 64ull << 20},   {1000, 64ull << 20}, {10000, 64ull << 20},
                             {1000, 256ull << 20}, {1000, 1ull << 30},  {1000, 4ull << 30}};
  char tmpl[] = "/tmp/wc-bench.XXXXXX";
  std::string root = ::mkdtemp(tmpl);
  auto backend = memory::MakeHostBackend();

  std::printf(
      "Acquire -> mapped on the host backend (%d reps each; client and daemon on one "
      "machine, real Unix sockets)\n\n",
      reps);
  std::printf(
      "| tensors | weights  | segments | median ms | p90 ms | max ms | RPC alone, as tensors ms "
      "| RPC alone, packed ms |\n");
  std::printf("|--------:|---------:|---------:|----------:|-------:|-------:|------:|------:|\n");
  for (const auto& c : cases) {
    if (c.bytes > max_gib * (1ull << 30)) continue;
    if (only_tensors != 0 && c.tensors != only_tensors) continue;
    std::string dir = root + "/m" + std::to_string(c.tensors) + "_" + std::to_string(c.bytes);
    bench::WriteSparseCheckpoint(dir, c.tensors, c.bytes);
    server::DaemonOptions o;
    o.socket_dir = root + "/s";
    spec::ModelSpec s;
    s.name = "bench";
    s.model_dir = dir;
    o.specs = {s};
    auto daemon = server::Daemon::Start(o, backend.get());
    if (!daemon.ok()) {
      std::fprintf(stderr, "daemon: %s\n", daemon.status().ToString().c_str());
      return 2;
    }
    auto client = client::Client::Connect(o.socket_dir);
    client::AcquireOptions ao;
    ao.model = "bench";
    ao.wait_ready = true;
    {  // warm: waits for the preload, opens the gRPC channel
      auto l = (*client)->Acquire(ao);
      if (!l.ok()) {
        std::fprintf(stderr, "acquire: %s\n", l.status().ToString().c_str());
        return 2;
      }
    }
    std::vector<double> ms;
    size_t segments = 0;
    for (int r = 0; r < reps; ++r) {
      auto t0 = std::chrono::steady_clock::now();
      auto l = (*client)->Acquire(ao);
      auto t1 = std::chrono::steady_clock::now();
      if (!l.ok()) return 2;
      segments = (*l)->segment_count();
      ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    }
    // The bare RPC, the manifest built per Acquire (`tensors`) against the packed bytes.
    const auto [rpc_tensors, rpc_packed] = bench::RawAcquireRpcMs(o.socket_dir, "bench", "", reps);
    std::printf("| %7d | %5.0f MiB | %8zu | %9.2f | %6.2f | %6.2f | %5.2f | %5.2f |\n", c.tensors,
                c.bytes / 1048576.0, segments, Percentile(ms, 0.5), Percentile(ms, 0.9),
                Percentile(ms, 1.0), rpc_tensors, rpc_packed);
    std::fflush(stdout);
    if (!bench::AppendJsonLine(json, {{"bench", "acquire"},
                                      {"backend", "host"},
                                      {"size_gib", c.bytes / static_cast<double>(1ull << 30)},
                                      {"tensors", c.tensors},
                                      {"ms_p50", Percentile(ms, 0.5)},
                                      {"ms_min", Percentile(ms, 0.0)},
                                      {"ms_max", Percentile(ms, 1.0)},
                                      {"ms_p90", Percentile(ms, 0.9)},
                                      {"reps", reps},
                                      {"segments", segments},
                                      {"rpc_tensors_ms", rpc_tensors},
                                      {"rpc_packed_ms", rpc_packed}})) {
      return 1;
    }
    client->reset();
    daemon->reset();
    std::filesystem::remove_all(dir);
  }
  std::filesystem::remove_all(root);
  return 0;
}
