// gpu_map_bench: what an engine pays to map a cached model-rank from GPU memory.
//
// For each (total size, segment size): a child process (the "daemon") allocates the
// segments with the cuda-vmm backend, exports them once and sends their FDs over a Unix
// socket (SCM_RIGHTS); this process (the "engine") then times MapCudaReadOnly — import every
// FD, reserve one VA range, map every segment, one read-only cuMemSetAccess — several times
// (fresh dup()s of the received FDs each time, as a new client would receive), and the
// teardown. The engine's own CUDA context creation is timed once, on its own row.
//
//   gpu_map_bench [--totals-gib=1,8,64] [--segments-mib=2048,16] [--reps=5]
//
// Prints a markdown table. Needs a GPU with (largest total) bytes free.
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "pkg/memory/cuda_backend.h"
#include "pkg/memory/internal/cuda_driver.h"
#include "pkg/memory/internal/cuda_hooks.h"
#include "pkg/memory/internal/cuda_segment.h"
#include "tests/gpu/fd_channel.h"

namespace weightcache::bench {
namespace {

using Clock = std::chrono::steady_clock;
constexpr uint64_t kMiB = 1ull << 20;
constexpr uint64_t kGiB = 1ull << 30;

double Ms(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

std::vector<uint64_t> ParseList(const std::string& s) {
  std::vector<uint64_t> out;
  size_t pos = 0;
  while (pos < s.size()) {
    size_t comma = s.find(',', pos);
    if (comma == std::string::npos) comma = s.size();
    out.push_back(std::strtoull(s.substr(pos, comma - pos).c_str(), nullptr, 10));
    pos = comma + 1;
  }
  return out;
}

void RaiseFdLimit() {
  rlimit r{};
  if (::getrlimit(RLIMIT_NOFILE, &r) == 0 && r.rlim_cur < r.rlim_max) {
    r.rlim_cur = r.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &r);
  }
}

// Child: allocate `count` segments of `seg` bytes on the first GPU, seal, send FDs with
// "<uuid> <alloc ms>" as payload, wait for the parent to close the socket.
int Exporter(int sock, uint64_t seg, uint64_t count) {
  RaiseFdLimit();
  auto backend = memory::MakeCudaBackend();
  if (!backend.ok()) {
    std::fprintf(stderr, "exporter: %s\n", backend.status().ToString().c_str());
    return 1;
  }
  // Devices() retains the primary context: its creation (~0.1 s) stays out of the timing.
  if ((*backend)->Devices().empty()) return 1;
  std::vector<std::unique_ptr<memory::Segment>> segs;
  std::vector<int> fds;
  auto t0 = Clock::now();
  for (uint64_t i = 0; i < count; ++i) {
    auto s = (*backend)->Allocate("", seg, "bench");
    if (!s.ok()) {
      std::fprintf(stderr, "exporter: segment %llu: %s\n", static_cast<unsigned long long>(i),
                   s.status().ToString().c_str());
      return 1;
    }
    if (auto st = (*s)->Seal(); !st.ok()) {
      std::fprintf(stderr, "exporter: %s\n", st.ToString().c_str());
      return 1;
    }
    fds.push_back((*s)->fd());
    segs.push_back(std::move(s).value());
  }
  double alloc_ms = Ms(t0, Clock::now());
  std::string payload = segs.front()->device_uuid() + " " + std::to_string(alloc_ms);
  if (auto st = gputest::SendFds(sock, fds, payload); !st.ok()) {
    std::fprintf(stderr, "exporter: %s\n", st.ToString().c_str());
    return 1;
  }
  char c;
  while (::read(sock, &c, 1) > 0) {
  }
  return 0;
}

struct Row {
  uint64_t total, seg, count;
  double alloc_ms;
  std::vector<double> map_ms, teardown_ms;
  memory::MapTimings best;  // the breakdown of the fastest repetition
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

int Run(const char* self, const std::vector<uint64_t>& totals_gib,
        const std::vector<uint64_t>& segs_mib, int reps) {
  RaiseFdLimit();
  // The engine's own CUDA context: driver load + cuInit + primary context, once per process.
  auto t0 = Clock::now();
  auto api = memory::internal::Driver();
  if (!api.ok()) {
    std::fprintf(stderr, "%s\n", api.status().ToString().c_str());
    return 1;
  }
  auto t1 = Clock::now();
  auto devs = memory::internal::ListDevices(**api);
  if (!devs.ok() || devs->empty()) {
    std::fprintf(stderr, "no usable GPU\n");
    return 1;
  }
  auto t2 = Clock::now();
  auto ctx = memory::internal::PrimaryContext::Retain(**api, devs->front().device);
  if (!ctx.ok()) {
    std::fprintf(stderr, "%s\n", ctx.status().ToString().c_str());
    return 1;
  }
  auto t3 = Clock::now();
  std::printf("GPU %s (%s), driver %d\n\n", devs->front().uuid.c_str(), devs->front().name.c_str(),
              (*api)->driver_version);
  std::printf("| engine's own CUDA setup | ms |\n|---|---:|\n");
  std::printf("| dlopen libcuda + cuGetProcAddress + cuInit | %.1f |\n", Ms(t0, t1));
  std::printf("| device enumeration | %.1f |\n", Ms(t1, t2));
  std::printf("| primary context creation (cuDevicePrimaryCtxRetain) | %.1f |\n\n", Ms(t2, t3));
  std::fflush(stdout);

  std::vector<Row> rows;
  for (uint64_t tg : totals_gib) {
    for (uint64_t sm : segs_mib) {
      Row row{};
      row.total = tg * kGiB;
      row.seg = std::min(sm * kMiB, row.total);
      row.count = row.total / row.seg;
      int sv[2];
      if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) return 1;
      std::fflush(nullptr);
      pid_t pid = ::fork();
      if (pid == 0) {
        if (sv[1] == 3 ? ::fcntl(3, F_SETFD, 0) < 0 : ::dup2(sv[1], 3) < 0) ::_exit(120);
        std::string seg_s = std::to_string(row.seg), count_s = std::to_string(row.count);
        ::execl(self, self, "--export", seg_s.c_str(), count_s.c_str(), nullptr);
        ::_exit(121);
      }
      ::close(sv[1]);
      ScopedFd sock(sv[0]);
      auto got = gputest::RecvFds(sock.get());
      if (!got.ok()) {
        std::fprintf(stderr, "%llu GiB / %llu MiB: exporter failed: %s\n",
                     static_cast<unsigned long long>(tg), static_cast<unsigned long long>(sm),
                     got.status().ToString().c_str());
        ::waitpid(pid, nullptr, 0);
        continue;
      }
      std::string uuid = got->payload.substr(0, got->payload.find(' '));
      row.alloc_ms = std::atof(got->payload.substr(got->payload.find(' ') + 1).c_str());
      std::vector<uint64_t> sizes(row.count, row.seg);
      double best = 1e300;
      for (int r = 0; r < reps; ++r) {
        std::vector<ScopedFd> fds;
        fds.reserve(got->fds.size());
        for (auto& f : got->fds) fds.push_back(std::move(f.Dup()).value());
        memory::MapTimings t;
        auto a = Clock::now();
        auto m = memory::internal::MapCudaReadOnly(std::move(fds), sizes, uuid, &t);
        auto b = Clock::now();
        if (!m.ok()) {
          std::fprintf(stderr, "map: %s\n", m.status().ToString().c_str());
          return 1;
        }
        m->reset();
        auto c = Clock::now();
        row.map_ms.push_back(Ms(a, b));
        row.teardown_ms.push_back(Ms(b, c));
        if (Ms(a, b) < best) {
          best = Ms(a, b);
          row.best = t;
        }
      }
      sock.reset();  // the exporter exits and frees its memory
      ::waitpid(pid, nullptr, 0);
      rows.push_back(row);
      std::fprintf(stderr, "done: %llu GiB as %llu x %llu MiB\n",
                   static_cast<unsigned long long>(tg), static_cast<unsigned long long>(row.count),
                   static_cast<unsigned long long>(row.seg / kMiB));
    }
  }

  std::printf(
      "| total | segments | daemon alloc+export+seal ms | map median ms | map min ms | "
      "import | reserve | cuMemMap | cuMemSetAccess | teardown median ms |\n"
      "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  for (const auto& r : rows) {
    std::printf(
        "| %llu GiB | %llu x %llu MiB | %.1f | %.2f | %.2f | %.2f | %.3f | %.2f | %.2f | %.2f |\n",
        static_cast<unsigned long long>(r.total / kGiB), static_cast<unsigned long long>(r.count),
        static_cast<unsigned long long>(r.seg / kMiB), r.alloc_ms, Median(r.map_ms),
        *std::min_element(r.map_ms.begin(), r.map_ms.end()), r.best.import_ms, r.best.reserve_ms,
        r.best.map_ms, r.best.access_ms, Median(r.teardown_ms));
  }
  std::printf(
      "\n(%d repetitions each; import..cuMemSetAccess: breakdown of the fastest; map "
      "includes device lookup and primary-context retain, %s)\n",
      reps, "the context already exists");
  return 0;
}

}  // namespace
}  // namespace weightcache::bench

int main(int argc, char** argv) {
  using namespace weightcache::bench;
  if (argc == 4 && std::strcmp(argv[1], "--export") == 0) {
    return Exporter(3, std::strtoull(argv[2], nullptr, 10), std::strtoull(argv[3], nullptr, 10));
  }
  std::vector<uint64_t> totals = {1, 8, 64}, segs = {2048, 16};
  int reps = 5;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--totals-gib=", 0) == 0)
      totals = ParseList(a.substr(13));
    else if (a.rfind("--segments-mib=", 0) == 0)
      segs = ParseList(a.substr(15));
    else if (a.rfind("--reps=", 0) == 0)
      reps = std::atoi(a.c_str() + 7);
    else {
      std::fprintf(stderr, "usage: %s [--totals-gib=1,8,64] [--segments-mib=2048,16] [--reps=5]\n",
                   argv[0]);
      return 2;
    }
  }
  char self[4096];
  ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) return 1;
  self[n] = 0;
  return Run(self, totals, segs, reps);
}
