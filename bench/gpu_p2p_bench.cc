// GPU-to-GPU copy bandwidth of the cuda-vmm backend's CopySegment, the
// primitive the daemon's peer policy uses: a sealed segment on one GPU copied
// into a new segment on the other, by the peer route (cuMemcpyDtoD, destination
// pulls over NVLink/PCIe) and the host-staged route (device -> 64 MiB pinned
// buffer -> device). The time includes what the daemon pays per segment: the
// temporary read-only mapping of the source. Every copy is checked (a window at
// the start, middle and end against the pattern). Prints a table.
//   gpu_p2p_bench [--sizes_mib=64,256,1024,4096] [--reps=3]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "pkg/memory/cuda_backend.h"
#include "pkg/memory/internal/cuda_segment.h"
#include "pkg/memory/mapping.h"

using namespace weightcache;

namespace {

void Pattern(std::vector<uint64_t> *buf, uint64_t base_word) {
  for (size_t i = 0; i < buf->size(); ++i) (*buf)[i] = (base_word + i) * 0x9E3779B97F4A7C15ull;
}

bool CheckWindow(const std::string &uuid, memory::Segment &seg, uint64_t off, size_t n) {
  auto *cs = memory::internal::AsCudaSegment(&seg);
  std::vector<uint64_t> got(n / 8), want(n / 8);
  auto s =
      memory::CopyToHost(memory::BackendKind::kCudaVmm, uuid,
                         static_cast<const std::byte *>(cs->device_ptr()) + off, n, got.data());
  if (!s.ok()) {
    std::fprintf(stderr, "check: %s\n", s.ToString().c_str());
    return false;
  }
  Pattern(&want, off / 8);
  return std::memcmp(got.data(), want.data(), n) == 0;
}

}  // namespace

int main(int argc, char **argv) {
  std::vector<uint64_t> sizes_mib{64, 256, 1024, 4096};
  int reps = 3;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--sizes_mib=", 0) == 0) {
      sizes_mib.clear();
      for (auto p : absl::StrSplit(a.substr(12), ',')) {
        uint64_t v = 0;
        if (absl::SimpleAtoi(std::string(p), &v)) sizes_mib.push_back(v);
      }
    } else if (a.rfind("--reps=", 0) == 0) {
      reps = std::max(1, std::atoi(a.c_str() + 7));
    }
  }
  auto backend = memory::MakeCudaBackend();
  if (!backend.ok()) {
    std::printf("gpu_p2p_bench: no GPU: %s\n", backend.status().ToString().c_str());
    return 0;
  }
  auto devices = (*backend)->Devices();
  if (devices.size() < 2) {
    std::printf("gpu_p2p_bench: needs 2 GPUs, found %zu\n", devices.size());
    return 0;
  }
  memory::Backend &b = **backend;
  std::printf("GPU0 %s (%s)\nGPU1 %s (%s)\n", devices[0].uuid.c_str(), devices[0].name.c_str(),
              devices[1].uuid.c_str(), devices[1].name.c_str());
  std::printf("cuDeviceCanAccessPeer 0->1: %d, 1->0: %d\n\n",
              b.CanAccessPeer(devices[0].uuid, devices[1].uuid) ? 1 : 0,
              b.CanAccessPeer(devices[1].uuid, devices[0].uuid) ? 1 : 0);
  std::printf("%-8s %-10s %-6s %10s %10s %10s %s\n", "SIZE", "DIRECTION", "ROUTE", "BEST_GB/s",
              "MEDIAN", "BEST_ms", "CHECK");

  constexpr size_t kFill = 64ull << 20;
  std::vector<uint64_t> fill(kFill / 8);
  for (uint64_t mib : sizes_mib) {
    const uint64_t size = mib << 20;
    for (int dir = 0; dir < 2; ++dir) {
      const auto &from = devices[dir];
      const auto &to = devices[1 - dir];
      auto src = b.Allocate(from.uuid, size, "p2p-src");
      if (!src.ok()) {
        std::printf("allocate %llu MiB: %s\n", static_cast<unsigned long long>(mib),
                    src.status().ToString().c_str());
        return 1;
      }
      for (uint64_t off = 0; off < size; off += kFill) {
        size_t n = std::min<uint64_t>(kFill, size - off);
        Pattern(&fill, off / 8);
        if (auto s = (*src)->CopyIn(off, fill.data(), n); !s.ok()) {
          std::printf("fill: %s\n", s.ToString().c_str());
          return 1;
        }
      }
      if (auto s = (*src)->Seal(); !s.ok()) {
        std::printf("seal: %s\n", s.ToString().c_str());
        return 1;
      }
      for (memory::CopyRoute route : {memory::CopyRoute::kPeer, memory::CopyRoute::kHostStaged}) {
        if (route == memory::CopyRoute::kPeer && !b.CanAccessPeer(from.uuid, to.uuid)) continue;
        std::vector<double> secs;
        bool ok = true;
        for (int r = 0; r < reps; ++r) {
          auto dst = b.Allocate(to.uuid, size, "p2p-dst");
          if (!dst.ok()) {
            std::printf("allocate dst: %s\n", dst.status().ToString().c_str());
            return 1;
          }
          auto t0 = std::chrono::steady_clock::now();
          auto s = b.CopySegment(**src, dst->get(), route, {});
          secs.push_back(
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
          if (!s.ok()) {
            std::printf("copy: %s\n", s.ToString().c_str());
            return 1;
          }
          if (r == 0) {
            constexpr size_t kWin = 1 << 20;
            ok = CheckWindow(to.uuid, **dst, 0, kWin) &&
                 CheckWindow(to.uuid, **dst, size / 2, kWin) &&
                 CheckWindow(to.uuid, **dst, size - kWin, kWin);
          }
        }
        std::sort(secs.begin(), secs.end());
        double best = secs.front(), median = secs[secs.size() / 2];
        std::printf("%-8s %-10s %-6s %10.1f %10.1f %10.2f %s\n",
                    (std::to_string(mib) + "MiB").c_str(), dir == 0 ? "GPU0->GPU1" : "GPU1->GPU0",
                    memory::CopyRouteName(route), size / best / 1e9, size / median / 1e9,
                    best * 1e3, ok ? "bytes ok" : "BYTES DIFFER");
        if (!ok) return 1;
      }
    }
  }
  return 0;
}
