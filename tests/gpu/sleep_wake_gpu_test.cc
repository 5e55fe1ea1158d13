// Sleep and wake on a GPU (ctest label `gpu`; skips, with the reason, without a usable GPU):
// this process is the engine. It maps model `a` through the client library (cuda-vmm), detaches
// (cuMemUnmap + cuMemRelease, the VA reservation kept), the operator evicts `a` and the GPU
// memory comes back, another model `b` is loaded and served meanwhile, and Reattach maps `a`
// again at the same device addresses with the checkpoint's bytes, read by a kernel and by a
// copy. docs/engines.md, "Sleep and wake".
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include "pkg/client/client.h"
#include "pkg/memory/cuda_backend.h"
#include "pkg/memory/mapping.h"
#include "pkg/safetensors/safetensors.h"
#include "pkg/safetensors/writer.h"
#include "tests/gpu/gpu_testkit.h"
#include "tests/integration/daemon_harness.h"
#include "tests/integration/process.h"
#include "tests/testutil/temp_dir.h"
#include "weightcache/v1/weightcache.pb.h"

namespace weightcache {
namespace {

using namespace std::chrono_literals;

std::string DaemonPath() {
  if (const char* p = std::getenv("WEIGHTCACHED"); p != nullptr && *p != '\0') return p;
#ifdef WEIGHTCACHED_PATH
  return WEIGHTCACHED_PATH;
#else
  return (std::filesystem::canonical("/proc/self/exe").parent_path() / "weightcached").string();
#endif
}

// ~300 MB of seeded bf16 with Llama names: enough that its release shows in cudaMemGetInfo.
safetensors::LlamaShape Mid(uint64_t seed) {
  safetensors::LlamaShape s;
  s.layers = 2;
  s.hidden = 2048;
  s.intermediate = 5632;
  s.heads = 16;
  s.kv_heads = 4;
  s.vocab = 32000;
  s.seed = seed;
  return s;
}

// Every tensor's device address, and its bytes copied to the host.
struct Seen {
  std::map<std::string, const void*> addresses;
  std::map<std::string, std::string> bytes;
};
Seen Read(const client::Lease& l) {
  Seen s;
  for (const auto& t : l.tensors()) {
    s.addresses[t.name] = t.data;
    std::string b(t.nbytes, '\0');
    EXPECT_TRUE(memory::CopyToHost(memory::BackendKind::kCudaVmm, l.device_uuid(), t.data, t.nbytes,
                                   b.data())
                    .ok())
        << t.name;
    s.bytes[t.name] = std::move(b);
  }
  return s;
}

TEST(SleepAndWakeGpu, SleepAndWakeDetachEvictLoadAnotherReattachSameAddressesAndBytes) {
  auto backend = memory::MakeCudaBackend({});
  if (!backend.ok()) GTEST_SKIP() << "no usable GPU: " << backend.status();
  const std::string uuid = (*backend)->Devices().at(0).uuid;
  const int ordinal = (*backend)->Devices().at(0).ordinal;
  backend->reset();
  testing::TempDir dir;
  ASSERT_TRUE(safetensors::WriteLlamaCheckpoint(dir / "a", Mid(1)).ok());
  ASSERT_TRUE(safetensors::WriteLlamaCheckpoint(dir / "b", Mid(2)).ok());
  std::ofstream(dir / "specs.yaml") << "models:\n  - name: a\n    model_dir: " << dir / "a"
                                    << "\n  - name: b\n    model_dir: " << dir / "b"
                                    << "\n";
  const std::string sock = dir / "s";
  auto d = testing::StartDaemon(
      {DaemonPath(), "--socket_dir=" + sock, "--backend=cuda", "--metrics_address=off",
       "--preload=false", "--spec_file=" + dir / "specs.yaml"},
      sock, dir / "daemon.log", {}, 120s);
  ASSERT_TRUE(d.ok()) << d.status();
  auto admin = testing::AdminClient(sock);

  client::AcquireOptions o;
  o.model = "a";
  o.device_uuid = uuid;
  o.wait_ready = true;
  o.load_on_miss = true;
  auto lease = d->client->Acquire(o);
  ASSERT_TRUE(lease.ok()) << lease.status();
  client::Lease& a = **lease;
  ASSERT_EQ(a.backend(), "cuda-vmm");
  const Seen before = Read(a);
  const std::string name = "model.layers.0.self_attn.q_proj.weight";
  ASSERT_EQ(before.bytes.at(name), testing::CheckpointTensorBytes(dir / "a", name));
  const client::TensorView* q = a.Find(name);
  uint64_t sum_before = 0;
  ASSERT_EQ(gputest::DeviceChecksum(q->data, q->nbytes, ordinal, &sum_before), "");

  uint64_t free0 = 0, total = 0;
  ASSERT_EQ(gputest::MemInfo(ordinal, &free0, &total), "");
  ASSERT_TRUE(a.Detach().ok());
  auto evicted = admin->EvictDetailed("a", "");
  ASSERT_TRUE(evicted.ok()) << evicted.status();
  EXPECT_EQ(evicted->evicted(), 1u);
  EXPECT_EQ(evicted->draining(), 0u);  // nobody maps it: freed at once
  uint64_t free1 = 0;
  ASSERT_EQ(gputest::MemInfo(ordinal, &free1, &total), "");
  // The engine held nothing of it: the whole entry came back to the GPU (granules included).
  EXPECT_GE(free1, free0 + a.total_bytes() * 9 / 10)
      << "free before " << free0 << ", after " << free1 << ", entry " << a.total_bytes();

  // Another model fills the memory meanwhile, served to another lease.
  o.model = "b";
  auto b = d->client->Acquire(o);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(Read(**b).bytes.at(name), testing::CheckpointTensorBytes(dir / "b", name));

  ASSERT_TRUE(a.Reattach().ok());
  const Seen after = Read(a);
  EXPECT_EQ(after.addresses, before.addresses);
  EXPECT_TRUE(after.bytes == before.bytes);
  uint64_t sum_after = 0;
  ASSERT_EQ(gputest::DeviceChecksum(q->data, q->nbytes, ordinal, &sum_after), "");
  EXPECT_EQ(sum_after, sum_before);
  EXPECT_EQ(sum_after, gputest::HostChecksum(before.bytes.at(name).data(), q->nbytes));
}

}  // namespace
}  // namespace weightcache
