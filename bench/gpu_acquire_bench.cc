// Acquire -> every tensor mapped, on the GPU, as an engine sees it: a daemon (a child
// process, cuda-vmm backend) loads each checkpoint into GPU memory; this process (the
// engine) connects, acquires, receives the FDs, imports and maps them read-only into one VA
// range and builds its tensor views (bench/engine.h, shared with concurrency_bench). Prints a
// Markdown table; the engine's own CUDA setup (driver load + cuInit, primary context) is
// timed once, on its own row. A size that does not fit in the GPU's free memory is skipped,
// with the reason, and so is one above --max_gib.
//   gpu_acquire_bench [--sizes_gib=1,8,64] [--tensors=100,1000,10000] [--reps=5]
//                     [--max_gib=120] [--read_threads=16] [--json=FILE] [--segment_gib=2]
// --segment_gib: the daemon backend's largest segment (CudaBackendOptions::max_segment_bytes).
// --json appends one line per row: {"bench":"acquire","backend":"cuda","size_gib",
// "tensors","ms_p50","ms_min","ms_max","reps","segments","load_s",...}, or with "skipped".
// Checkpoints are sparse files (zeros): mapping time does not depend on the values.
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "bench/engine.h"
#include "bench/raw_rpc.h"
#include "bench/sparse_checkpoint.h"
#include "pkg/client/client.h"
#include "pkg/memory/cuda_backend.h"
#include "pkg/memory/mapping.h"
#include "pkg/server/daemon.h"
#include "pkg/spec/spec.h"
#include "weightcache/v1/weightcache.pb.h"

using namespace weightcache;
using bench::Clock;
using bench::Ms;
using bench::ParseList;

namespace {

// Once per case, outside the timing: every tensor's three stamps (sparse_checkpoint.h),
// read back through the engine's mapping. Prints a row; false when one differs.
bool CheckStamps(const client::Lease& lease, const std::string& uuid) {
  uint64_t checked = 0, wrong = 0;
  uint8_t want[bench::kStampBytes], got[bench::kStampBytes];
  for (const auto& v : lease.tensors()) {
    if (v.nbytes < bench::kStampBytes) continue;
    const auto spots = bench::StampOffsets(v.nbytes);
    for (int k = 0; k < 3; ++k) {
      bench::StampAt(v.name, k, want);
      auto st = memory::CopyToHost(memory::BackendKind::kCudaVmm, uuid,
                                   static_cast<const std::byte*>(v.data) + spots[k],
                                   bench::kStampBytes, got);
      ++checked;
      if (!st.ok() || std::memcmp(want, got, bench::kStampBytes) != 0) ++wrong;
    }
  }
  std::printf("|  | bytes sampled through the engine's mapping | %llu stamps | %s | | | | | |\n",
              static_cast<unsigned long long>(checked), wrong == 0 ? "all equal" : "WRONG");
  return wrong == 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<double> sizes = {1, 8, 64};
  std::vector<double> counts = {100, 1000, 10000};
  int reps = 5;
  double max_gib = 120;
  unsigned read_threads = 16;
  double segment_gib = 2;
  std::string json;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--sizes_gib=", 12) == 0) sizes = ParseList(argv[i] + 12);
    if (std::strncmp(argv[i], "--tensors=", 10) == 0) counts = ParseList(argv[i] + 10);
    if (std::strncmp(argv[i], "--reps=", 7) == 0) reps = std::atoi(argv[i] + 7);
    if (std::strncmp(argv[i], "--max_gib=", 10) == 0) max_gib = std::atof(argv[i] + 10);
    if (std::strncmp(argv[i], "--read_threads=", 15) == 0) read_threads = std::atoi(argv[i] + 15);
    if (std::strncmp(argv[i], "--json=", 7) == 0) json = argv[i] + 7;
    if (std::strncmp(argv[i], "--segment_gib=", 14) == 0) segment_gib = std::atof(argv[i] + 14);
  }
  char tmpl[] = "/tmp/wc-gpu-bench.XXXXXX";
  std::string root = ::mkdtemp(tmpl);
  struct Case {
    double gib;
    int tensors;
    std::string name;
  };
  std::vector<Case> cases;
  server::DaemonOptions o;
  o.socket_dir = root + "/s";
  o.preload = false;
  o.read_threads = read_threads;
  for (double g : sizes) {
    if (g > max_gib) {
      std::printf("skipped: %g GiB (above --max_gib=%g)\n", g, max_gib);
      for (double t : counts) {
        bench::AppendJsonLine(json, {{"bench", "acquire"},
                                     {"backend", "cuda"},
                                     {"size_gib", g},
                                     {"tensors", static_cast<int>(t)},
                                     {"skipped", "above --max_gib"}});
      }
      continue;
    }
    for (double t : counts) {
      Case c{g, static_cast<int>(t), "m" + std::to_string(cases.size())};
      bench::WriteSparseCheckpoint(root + "/" + c.name, c.tensors,
                                   static_cast<uint64_t>(g * (1ull << 30)));
      spec::ModelSpec s;
      s.name = c.name;
      s.model_dir = root + "/" + c.name;
      o.specs.push_back(s);
      cases.push_back(c);
    }
  }

  // The daemon: a child started before this process touches CUDA.
  int ready[2], stop[2];
  if (::pipe(ready) != 0 || ::pipe(stop) != 0) return 2;
  pid_t daemon_pid = ::fork();
  if (daemon_pid == 0) {
    ::close(ready[0]);
    ::close(stop[1]);
    memory::CudaBackendOptions bo;
    bo.max_segment_bytes = static_cast<uint64_t>(segment_gib * (1ull << 30));
    auto backend = memory::MakeCudaBackend(bo);
    if (!backend.ok()) {
      std::fprintf(stderr, "daemon: %s\n", backend.status().ToString().c_str());
      _exit(2);
    }
    auto d = server::Daemon::Start(o, backend->get());
    if (!d.ok()) {
      std::fprintf(stderr, "daemon: %s\n", d.status().ToString().c_str());
      _exit(2);
    }
    (void)!::write(ready[1], "r", 1);
    char ch;
    (void)!::read(stop[0], &ch, 1);  // until the engine is done (or dies)
    d->reset();
    _exit(0);
  }
  ::close(ready[1]);
  ::close(stop[0]);
  char ch;
  if (::read(ready[0], &ch, 1) != 1) {
    std::fprintf(stderr, "daemon did not start\n");
    return 2;
  }

  // The engine's own CUDA setup, on its own row.
  auto gpu = bench::EngineGpu::Open();
  if (!gpu.ok()) {
    std::fprintf(stderr, "%s\n", gpu.status().ToString().c_str());
    return 2;
  }
  const std::string uuid = (*gpu)->uuid();

  std::printf("GPU: %s %s\n\n", (*gpu)->name().c_str(), uuid.c_str());
  std::printf("| engine's own CUDA setup (not weightcache's) | ms |\n|---|---:|\n");
  std::printf("| dlopen libcuda + cuGetProcAddress + cuInit | %.1f |\n", (*gpu)->driver_ms());
  std::printf("| device enumeration | %.1f |\n", (*gpu)->enumerate_ms());
  std::printf("| primary context creation (cuDevicePrimaryCtxRetain) | %.1f |\n\n",
              (*gpu)->context_ms());

  auto client = client::Client::Connect(o.socket_dir);
  if (!client.ok()) return 2;
  std::printf(
      "| weights | tensors | segments | daemon load s | load GB/s | Acquire -> mapped median ms | "
      "min ms | max ms | release ms |\n");
  std::printf("|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  std::fflush(stdout);
  int rc = 0;
  for (const auto& c : cases) {
    // Skip what cannot fit: the weights (plus 2% for granules and alignment) in free memory.
    const double need = c.gib * (1ull << 30) * 1.02;
    double free_bytes = -1;
    if (auto st = (*client)->Status(); st.ok()) {
      for (const auto& d : st->devices()) {
        if (d.device_uuid() == uuid) free_bytes = static_cast<double>(d.free_bytes());
      }
    }
    if (free_bytes >= 0 && need > free_bytes) {
      char why[128];
      std::snprintf(why, sizeof why, "needs %.1f GiB of GPU memory, %.1f GiB free",
                    need / (1ull << 30), free_bytes / (1ull << 30));
      std::printf("| %g GiB | %d | skipped: %s | | | | | | |\n", c.gib, c.tensors, why);
      std::fflush(stdout);
      bench::AppendJsonLine(json, {{"bench", "acquire"},
                                   {"backend", "cuda"},
                                   {"size_gib", c.gib},
                                   {"tensors", c.tensors},
                                   {"skipped", why}});
      continue;
    }
    auto l0 = Clock::now();
    auto s = (*client)->Load(c.name, "", nullptr);
    double load_s = Ms(l0, Clock::now()) / 1e3;
    if (!s.ok()) {
      std::fprintf(stderr, "load %s: %s\n", c.name.c_str(), s.ToString().c_str());
      rc = 1;
      continue;
    }
    client::AcquireOptions ao;
    ao.model = c.name;
    ao.device_uuid = uuid;
    std::vector<double> ms, rel;
    std::vector<std::pair<double, client::Lease::Timings>> stages;  // by total, for the median
    size_t segments = 0;
    for (int r = 0; r < reps + 1; ++r) {  // the first is a warm-up (gRPC channel)
      auto a0 = Clock::now();
      auto lease = bench::AcquireMapped(**client, ao, c.tensors);
      auto a1 = Clock::now();
      if (!lease.ok()) {
        std::fprintf(stderr, "acquire %s: %s\n", c.name.c_str(), lease.status().ToString().c_str());
        rc = 1;
        break;
      }
      segments = (*lease)->segment_count();
      const client::Lease::Timings timings = (*lease)->timings();
      if (r == 1) rc |= CheckStamps(**lease, uuid) ? 0 : 1;
      auto r0 = Clock::now();
      lease->reset();
      auto r1 = Clock::now();
      if (r > 0) {
        ms.push_back(Ms(a0, a1));
        rel.push_back(Ms(r0, r1));
        stages.emplace_back(Ms(a0, a1), timings);
      }
    }
    if (!ms.empty()) {
      std::sort(ms.begin(), ms.end());
      std::sort(rel.begin(), rel.end());
      std::printf("| %g GiB | %d | %zu | %.2f | %.1f | %.2f | %.2f | %.2f | %.2f |\n", c.gib,
                  c.tensors, segments, load_s, c.gib * (1ull << 30) / 1e9 / load_s,
                  ms[ms.size() / 2], ms.front(), ms.back(), rel[rel.size() / 2]);
      // Where the median repetition's time went.
      std::sort(stages.begin(), stages.end(),
                [](const auto& a, const auto& b) { return a.first < b.first; });
      const auto& t = stages[stages.size() / 2].second;
      std::printf(
          "|  | stages of the median (ms) | rpc %.2f | claim fds %.2f | context %.2f | import "
          "%.2f | reserve %.2f | map %.2f | access %.2f, views %.2f |\n",
          t.rpc_ms, t.claim_ms, t.map.context_ms, t.map.import_ms, t.map.reserve_ms, t.map.map_ms,
          t.map.access_ms, t.views_ms);
      const auto [rpc_tensors, rpc_packed] =
          bench::RawAcquireRpcMs(o.socket_dir, c.name, uuid, reps);
      std::printf("|  | Acquire RPC alone (ms) | as tensors %.2f | packed %.2f | | | | | |\n",
                  rpc_tensors, rpc_packed);
      std::fflush(stdout);
      if (!bench::AppendJsonLine(json, {{"bench", "acquire"},
                                        {"backend", "cuda"},
                                        {"size_gib", c.gib},
                                        {"tensors", c.tensors},
                                        {"ms_p50", ms[ms.size() / 2]},
                                        {"ms_min", ms.front()},
                                        {"ms_max", ms.back()},
                                        {"reps", static_cast<int>(ms.size())},
                                        {"segments", segments},
                                        {"load_s", load_s},
                                        {"release_ms", rel[rel.size() / 2]},
                                        {"rpc_ms", t.rpc_ms},
                                        {"claim_ms", t.claim_ms},
                                        {"import_ms", t.map.import_ms},
                                        {"map_ms", t.map.map_ms},
                                        {"access_ms", t.map.access_ms},
                                        {"views_ms", t.views_ms},
                                        {"rpc_tensors_ms", rpc_tensors},
                                        {"rpc_packed_ms", rpc_packed}})) {
        rc = 1;
      }
    }
    (void)(*client)->Evict(c.name, "");
  }
  ::close(stop[1]);
  int status = 0;
  ::waitpid(daemon_pid, &status, 0);
  std::filesystem::remove_all(root);
  return rc;
}
