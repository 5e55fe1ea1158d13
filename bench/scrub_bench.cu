// scrub_bench: the integrity scrubber's cost on a GPU (issue 27, docs/benchmarks.md).
//  1. Digest throughput: integrity::DigestSegment over sealed cuda-vmm segments (the daemon's
//     own path: a read-only mapping of the exported descriptor, the kernel on a lowest-priority
//     stream), unthrottled; then the kernels alone, the scrub digest (secret-keyed NH) and a
//     fill's digest (NH + sha256-tree, issue 48).
//  2. A co-located "engine": a bandwidth-bound kernel (read+write of a 4 GiB working set) on a
//     highest-priority stream, alone and beside a scrubber looping DigestSegment at a budget.
// Prints markdown tables. Usage: scrub_bench [--gib=N (resident, default 32)] [--reps=N]
#include <cuda_runtime.h>
#include <fcntl.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "pkg/integrity/internal/digest_cuda.h"
#include "pkg/integrity/segment_digest.h"
#include "pkg/memory/backend.h"
#include "pkg/memory/cuda_backend.h"
#include "pkg/memory/internal/cuda_segment.h"
#include "pkg/memory/mapping.h"
#include "pkg/util/scoped_fd.h"

namespace {

__global__ void Engine(const uint4* __restrict__ in, uint4* __restrict__ out, uint64_t n) {
  for (uint64_t i = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<uint64_t>(gridDim.x) * blockDim.x) {
    uint4 v = in[i];
    v.x += 1;
    out[i] = v;
  }
}

__global__ void Fill(uint4* p, uint64_t n) {
  for (uint64_t i = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<uint64_t>(gridDim.x) * blockDim.x) {
    p[i] = make_uint4(static_cast<uint32_t>(i), static_cast<uint32_t>(i * 7), 3u,
                      static_cast<uint32_t>(i >> 3));
  }
}

#define CK(x)                                                       \
  do {                                                              \
    cudaError_t e_ = (x);                                           \
    if (e_ != cudaSuccess) {                                        \
      std::fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                 \
    }                                                               \
  } while (0)

double Seconds(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  using namespace weightcache;
  uint64_t gib = 32;
  int reps = 5;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--gib=", 6) == 0) gib = std::strtoull(argv[i] + 6, nullptr, 10);
    if (std::strncmp(argv[i], "--reps=", 7) == 0) reps = std::atoi(argv[i] + 7);
  }
  auto backend = memory::MakeCudaBackend({});
  if (!backend.ok()) {
    std::fprintf(stderr, "no usable GPU: %s\n", backend.status().ToString().c_str());
    return 0;
  }
  const auto dev = (*backend)->Devices().at(0);
  // The first digest in a process also starts the CUDA runtime (the daemon's first one runs
  // at its first fill or keeper adoption): timed before anything else touches the runtime.
  {
    auto cold = (*backend)->Allocate(dev.uuid, 1ull << 30, "scrub-bench-cold");
    if (!cold.ok() || !(*cold)->Seal().ok()) return 1;
    for (const char* when : {"first in the process (runtime cold)", "second"}) {
      const auto t0 = std::chrono::steady_clock::now();
      auto d = integrity::DigestSegment(memory::BackendKind::kCudaVmm, **cold, {});
      std::printf("digest of one 1 GiB segment, %s: %.2f ms%s\n", when, Seconds(t0) * 1e3,
                  d.ok() ? "" : " (failed)");
    }
    std::printf("\n");
  }
  // Resident "weights": 1 GiB segments, filled by a kernel through the daemon-side mapping.
  std::vector<std::unique_ptr<memory::Segment>> segs;
  for (uint64_t i = 0; i < gib; ++i) {
    auto s = (*backend)->Allocate(dev.uuid, 1ull << 30, "scrub-bench");
    if (!s.ok()) {
      std::fprintf(stderr, "allocate: %s\n", s.status().ToString().c_str());
      return 1;
    }
    auto* c = memory::internal::AsCudaSegment(s->get());
    CK(cudaSetDevice(dev.ordinal));
    Fill<<<1024, 512>>>(static_cast<uint4*>(c->device_ptr()), (1ull << 30) / 16);
    CK(cudaDeviceSynchronize());
    if (auto st = (*s)->Seal(); !st.ok()) return 1;
    segs.push_back(std::move(s).value());
  }
  std::printf("## scrub_bench on %s (%s), %llu GiB resident in 1 GiB segments\n\n",
              dev.name.c_str(), dev.uuid.c_str(), static_cast<unsigned long long>(gib));
  // `reps` unthrottled passes over every segment, `digest(i)` digesting segment i: a table.
  auto passes = [&](const char* what,
                    const std::function<absl::StatusOr<integrity::SegmentDigest>(size_t)>& digest) {
    std::printf("| %s | GiB | s | GB/s |\n|---|---|---|---|\n", what);
    for (int r = 0; r < reps; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      for (size_t i = 0; i < segs.size(); ++i) {
        auto d = digest(i);
        if (!d.ok()) {
          std::fprintf(stderr, "digest: %s\n", d.status().ToString().c_str());
          return false;
        }
      }
      const double secs = Seconds(t0);
      std::printf("| %d | %llu | %.4f | %.0f |\n", r, static_cast<unsigned long long>(gib), secs,
                  gib * (1ull << 30) / secs / 1e9);
    }
    return true;
  };
  if (!passes("digest pass (unthrottled)", [&](size_t i) {
        return integrity::DigestSegment(memory::BackendKind::kCudaVmm, *segs[i], {});
      })) {
    return 1;
  }

  // The same passes over read-only mappings made once beforehand, not per call as
  // DigestSegment does: the difference is what mapping and unmapping cost per digest.
  std::vector<std::unique_ptr<memory::SegmentMapping>> views;
  const auto m0 = std::chrono::steady_clock::now();
  for (auto& s : segs) {
    std::vector<ScopedFd> fds;
    fds.emplace_back(fcntl(s->fd(), F_DUPFD_CLOEXEC, 0));
    auto m =
        memory::MapReadOnly(memory::BackendKind::kCudaVmm, std::move(fds), {s->size()}, dev.uuid);
    if (!m.ok()) {
      std::fprintf(stderr, "map: %s\n", m.status().ToString().c_str());
      return 1;
    }
    views.push_back(std::move(m).value());
  }
  std::printf("\nmapping the %llu segments read-only once: %.2f ms\n\n",
              static_cast<unsigned long long>(gib), Seconds(m0) * 1e3);
  const integrity::Pace unthrottled;
  const integrity::internal::Pacer no_pacing(unthrottled);
  if (!passes("digest pass, kernel only (mapped beforehand)", [&](size_t i) {
        return integrity::internal::DigestDevice(dev.uuid, views[i]->base(0), segs[i]->size(),
                                                 no_pacing, integrity::ProcessKey(), false);
      })) {
    return 1;
  }
  // What a fill computes (issue 48): the scrub digest and the cryptographic one (sha256-tree);
  // the difference from the pass above is the SHA-256 kernel's time.
  if (!passes("scrub + sha256-tree digest (fill), kernels only", [&](size_t i) {
        return integrity::internal::DigestDevice(dev.uuid, views[i]->base(0), segs[i]->size(),
                                                 no_pacing, integrity::ProcessKey(), true);
      })) {
    return 1;
  }
  views.clear();

  // The engine: its own buffers (cudaMalloc), highest priority.
  const uint64_t eng = 4ull << 30;
  uint4 *in = nullptr, *out = nullptr;
  CK(cudaSetDevice(dev.ordinal));
  CK(cudaMalloc(&in, eng));
  CK(cudaMalloc(&out, eng));
  Fill<<<1024, 512>>>(in, eng / 16);
  CK(cudaDeviceSynchronize());
  int least = 0, greatest = 0;
  CK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  cudaStream_t stream;
  CK(cudaStreamCreateWithPriority(&stream, cudaStreamNonBlocking, greatest));
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  auto engine_gbps = [&](double budget, double* scrub_gbps) {
    std::atomic<bool> stop{false};
    std::atomic<uint64_t> scrubbed{0};
    std::thread scrubber;
    const auto s0 = std::chrono::steady_clock::now();
    if (budget >= 0) {
      scrubber = std::thread([&] {
        integrity::Pace pace;
        pace.bytes_per_second = budget;
        pace.stop = [&] { return stop.load(); };
        // Passes back to back over every segment, as the daemon's scrubber with an interval
        // shorter than a pass.
        while (!stop) {
          for (auto& s : segs) {
            if (stop) break;
            auto d = integrity::DigestSegment(memory::BackendKind::kCudaVmm, *s, pace);
            if (d.ok()) scrubbed += s->size();
          }
        }
      });
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    CK(cudaSetDevice(dev.ordinal));
    const int n = 200;
    CK(cudaEventRecord(a, stream));
    for (int r = 0; r < n; ++r)
      Engine<<<132 * 8, 512, 0, stream>>>(in, reinterpret_cast<uint4*>(out), eng / 16);
    CK(cudaEventRecord(b, stream));
    CK(cudaEventSynchronize(b));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, a, b));
    stop = true;
    if (scrubber.joinable()) scrubber.join();
    *scrub_gbps = budget >= 0 ? scrubbed / Seconds(s0) / 1e9 : 0;
    return 2.0 * eng * n / (ms * 1e6);
  };
  double ignored = 0;
  const double alone = engine_gbps(-1, &ignored);
  std::printf("\n| scrubber budget | engine GB/s (read+write) | engine slowdown | scrub GB/s |\n");
  std::printf("|---|---|---|---|\n| none | %.0f | - | - |\n", alone);
  for (double budget : {10e9, 50e9, 100e9, 200e9, 0.0}) {
    double got = 0;
    const double e = engine_gbps(budget, &got);
    std::printf("| %s | %.0f | %.2f %% | %.0f |\n",
                budget == 0 ? "unthrottled"
                            : (std::to_string(static_cast<int>(budget / 1e9)) + " GB/s").c_str(),
                e, 100.0 * (alone - e) / alone, got);
  }
  const double again = engine_gbps(-1, &ignored);
  std::printf("| none (again) | %.0f | %.2f %% | - |\n", again, 100.0 * (alone - again) / alone);
  return 0;
}
