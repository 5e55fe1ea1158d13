// An "engine" process for the 2-GPU test (multi_gpu_test.cc). Started with a
// CUDA_VISIBLE_DEVICES of its own, it names ITS device 0 by UUID, acquires one
// tensor-parallel rank for that GPU, copies every mapped tensor to the host and
// prints its hash.
//   wc_mgpu_engine SOCKET_DIR MODEL TP_SIZE TP_RANK
//   wc_mgpu_engine --list      "DEVICE <ordinal> <uuid>" per GPU, "PEER <0|1>"
//   (GPU 0 -> 1),
//                              "DONE"; or "NOGPU <reason>". The test asks this
//                              child, so the test process itself never
//                              initialises CUDA before it forks.
// Output: "VISIBLE <count> <uuid of device 0>", "LEASE <device uuid>
// <fingerprint>", "TENSOR <name> <fnv1a64 hex>" per tensor, "DONE"; on a
// failure "ERROR <message>" (exit 2).
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "pkg/client/client.h"
#include "pkg/memory/cuda_backend.h"
#include "pkg/memory/mapping.h"

using namespace weightcache;

namespace {

uint64_t Fnv1a(const unsigned char *p, size_t n) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

int Fail(const absl::Status &s) {
  std::printf("ERROR %s\n", s.ToString().c_str());
  return 2;
}

}  // namespace

int main(int argc, char **argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  if (argc == 2 && std::string(argv[1]) == "--list") {
    auto b = memory::MakeCudaBackend();
    if (!b.ok()) {
      std::printf("NOGPU %s\n", b.status().ToString().c_str());
      return 0;
    }
    auto d = (*b)->Devices();
    for (const auto &x : d) std::printf("DEVICE %d %s\n", x.ordinal, x.uuid.c_str());
    std::printf("PEER %d\n", d.size() >= 2 && (*b)->CanAccessPeer(d[0].uuid, d[1].uuid) ? 1 : 0);
    std::printf("DONE\n");
    return 0;
  }
  if (argc != 5) {
    std::printf("ERROR usage: wc_mgpu_engine SOCKET_DIR MODEL TP_SIZE TP_RANK\n");
    return 2;
  }
  // The UUID of what this process calls device 0 (CUDA_VISIBLE_DEVICES decides
  // which GPU).
  auto backend = memory::MakeCudaBackend();
  if (!backend.ok()) return Fail(backend.status());
  auto devices = (*backend)->Devices();
  std::printf("VISIBLE %zu %s\n", devices.size(), devices.at(0).uuid.c_str());

  auto c = client::Client::Connect(argv[1]);
  if (!c.ok()) return Fail(c.status());
  client::AcquireOptions o;
  o.model = argv[2];
  o.tp_size = std::atoi(argv[3]);
  o.tp_rank = std::atoi(argv[4]);
  o.device_uuid = devices.at(0).uuid;
  o.wait_ready = true;
  auto lease = (*c)->Acquire(o);
  if (!lease.ok()) return Fail(lease.status());
  const auto &l = **lease;
  std::printf("LEASE %s %s\n", l.device_uuid().c_str(), l.fingerprint().c_str());
  std::vector<unsigned char> buf;
  for (const auto &t : l.tensors()) {
    buf.resize(t.nbytes);
    auto s = memory::CopyToHost(memory::BackendKind::kCudaVmm, l.device_uuid(), t.data, t.nbytes,
                                buf.data());
    if (!s.ok()) return Fail(s);
    std::printf("TENSOR %s %016llx\n", t.name.c_str(),
                static_cast<unsigned long long>(Fnv1a(buf.data(), buf.size())));
  }
  std::printf("DONE\n");
  return 0;
}
