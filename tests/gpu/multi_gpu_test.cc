// Two GPUs, one daemon (ctest label gpu; skips below 2 GPUs with the reason). A
// tp_size 2 model is preloaded with rank r on GPU r; engine processes, each
// with its own CUDA_VISIBLE_DEVICES (so each calls its GPU device 0), name
// their GPU by UUID and must map the shard of the rank they ask for, byte for
// byte. Then an engine on GPU 1 asks for rank 0 (resident on GPU 0 only): the
// daemon serves it by a peer copy (policy copy) or a host-staged copy (policy
// host). The reference bytes are the same rank loaded by the CPU loader into
// host memory, and, for replicated tensors, the checkpoint itself.
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include "gtest/gtest.h"
#include "pkg/client/client.h"
#include "pkg/load/loader.h"
#include "pkg/load/model.h"
#include "pkg/load/plan.h"
#include "pkg/memory/cuda_backend.h"
#include "pkg/safetensors/safetensors.h"
#include "pkg/safetensors/writer.h"
#include "tests/integration/daemon_harness.h"
#include "tests/integration/process.h"
#include "tests/testutil/temp_dir.h"
#include "weightcache/v1/weightcache.pb.h"

namespace weightcache {
namespace {

using namespace std::chrono_literals;
using testing::Process;
using testing::TempDir;
using Hashes = std::map<std::string, std::string>;  // tensor name -> fnv1a64 hex

// The binaries under test: the build's, or (on the GPU machine, from carried
// binaries) the paths in $WEIGHTCACHED and $WC_MGPU_ENGINE.
std::string Binary(const char *env, const char *built) {
  const char *v = std::getenv(env);
  return v != nullptr && *v != '\0' ? v : built;
}

std::string Fnv1a(const void *data, size_t n) {
  const auto *p = static_cast<const unsigned char *>(data);
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  char out[17];
  std::snprintf(out, sizeof out, "%016llx", static_cast<unsigned long long>(h));
  return out;
}

safetensors::LlamaShape Shape() {
  safetensors::LlamaShape s;
  s.layers = 2;
  s.hidden = 512;
  s.intermediate = 1024;
  s.heads = 8;
  s.kv_heads = 4;
  s.vocab = 4096;
  return s;
}

struct EngineResult {
  std::string visible_uuid;
  int visible_count = 0;
  std::string lease_device;
  std::string fingerprint;
  Hashes hashes;
  std::string error;
};

class MultiGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // The GPUs, as a child process sees them: this process must not initialise
    // CUDA itself before it forks the daemon and the engines.
    Process list({Binary("WC_MGPU_ENGINE", MGPU_ENGINE_PATH), "--list"}, dir_ / "list.log");
    std::string nogpu;
    while (auto line = list.ReadLine(60s)) {
      std::istringstream in(*line);
      std::string tag;
      in >> tag;
      if (tag == "NOGPU") nogpu = *line;
      if (tag == "DEVICE") {
        memory::DeviceInfo d;
        in >> d.ordinal >> d.uuid;
        devices_.push_back(d);
      }
      if (tag == "PEER") in >> can_peer_;
      if (tag == "DONE") break;
    }
    list.Wait();
    if (!nogpu.empty()) GTEST_SKIP() << "no usable GPU: " << nogpu;
    if (devices_.size() < 2) {
      GTEST_SKIP() << "needs 2 GPUs, this machine shows " << devices_.size()
                   << " (run on nvidia-h200-x2: tests/gpu/run-on-device-x2.sh)";
    }
    ASSERT_TRUE(safetensors::WriteLlamaCheckpoint(dir_ / "tiny", Shape()).ok());
  }

  // Reference: rank `rank` loaded by the CPU loader into host memory.
  Hashes Reference(int rank) {
    spec::ModelSpec s;
    s.name = "tiny";
    s.model_dir = dir_ / "tiny";
    s.tp_size = 2;
    auto opened = load::OpenModel(s);
    EXPECT_TRUE(opened.ok()) << opened.status();
    if (!opened.ok()) return {};
    auto host = memory::MakeHostBackend();
    load::PlanOptions po;
    po.loader_reads_pieces = true;
    auto plan = load::PlanRank(**opened, {2, rank, 1, 0}, po);
    EXPECT_TRUE(plan.ok()) << plan.status();
    if (!plan.ok()) return {};
    auto loaded = load::LoadRank(**opened, *plan, *host, "", "ref", {}, nullptr);
    EXPECT_TRUE(loaded.ok()) << loaded.status();
    if (!loaded.ok()) return {};
    std::vector<const std::byte *> bases;
    for (const auto &seg : (*loaded)->segments) {
      void *p = ::mmap(nullptr, seg->size(), PROT_READ, MAP_SHARED, seg->fd(), 0);
      EXPECT_NE(p, MAP_FAILED);
      bases.push_back(static_cast<const std::byte *>(p));
    }
    Hashes out;
    for (const auto *list : {&(*loaded)->plan.tensors, &(*loaded)->plan.views}) {
      for (const auto &t : *list) out[t.name] = Fnv1a(bases[t.segment] + t.offset, t.nbytes);
    }
    for (size_t i = 0; i < bases.size(); ++i) {
      ::munmap(const_cast<std::byte *>(bases[i]), (*loaded)->segments[i]->size());
    }
    return out;
  }

  // Hash of a tensor straight from the checkpoint file (for replicated
  // tensors).
  std::string CheckpointHash(const std::string &name) {
    auto ckpt = safetensors::Checkpoint::Open(dir_ / "tiny");
    EXPECT_TRUE(ckpt.ok());
    for (const auto &t : ckpt->tensors()) {
      if (t.name != name) continue;
      std::vector<char> buf(t.nbytes);
      const auto &f = ckpt->files()[t.file_index];
      EXPECT_EQ(::pread(f.fd(), buf.data(), t.nbytes, static_cast<off_t>(t.file_offset)),
                static_cast<ssize_t>(t.nbytes));
      return Fnv1a(buf.data(), buf.size());
    }
    return "missing";
  }

  void StartDaemon(const std::string &sub, const std::string &policy) {
    socket_dir_ = dir_ / sub;
    log_ = dir_ / (sub + ".log");
    std::vector<std::string> argv{Binary("WEIGHTCACHED", WEIGHTCACHED_PATH),
                                  "--socket_dir=" + socket_dir_,
                                  "--backend=cuda",
                                  "--metrics_address=off",
                                  "--peer_policy=" + policy,
                                  "--model=name=tiny,model_dir=" + (dir_ / "tiny") + ",tp_size=2"};
    daemon_.reset();
    auto d = testing::StartDaemon(
        argv, socket_dir_, log_,
        [](const v1::StatusResponse &st) {
          return st.entries_size() == 2 && st.entries(0).state() == "ready" &&
                 st.entries(1).state() == "ready";
        },
        60s);
    ASSERT_TRUE(d.ok()) << "daemon did not preload both ranks: " << d.status();
    daemon_ = std::move(d->process);
    client_ = std::move(d->client);
  }

  std::string Log() const { return testing::ReadFileOrEmpty(log_); }

  // Runs an engine that sees only GPU `ordinal` and asks for `rank`.
  EngineResult Engine(int ordinal, int rank) {
    std::string err = dir_ / ("engine-" + std::to_string(ordinal) + "-" + std::to_string(rank));
    Process p({"/usr/bin/env", "CUDA_VISIBLE_DEVICES=" + std::to_string(ordinal),
               Binary("WC_MGPU_ENGINE", MGPU_ENGINE_PATH), socket_dir_, "tiny", "2",
               std::to_string(rank)},
              err);
    EngineResult r;
    while (auto line = p.ReadLine(60s)) {
      std::istringstream in(*line);
      std::string tag;
      in >> tag;
      if (tag == "VISIBLE") {
        in >> r.visible_count >> r.visible_uuid;
      } else if (tag == "LEASE") {
        in >> r.lease_device >> r.fingerprint;
      } else if (tag == "TENSOR") {
        std::string name, hash;
        in >> name >> hash;
        r.hashes[name] = hash;
      } else if (tag == "ERROR") {
        r.error = *line;
      } else if (tag == "DONE") {
        break;
      }
    }
    p.Wait();
    return r;
  }

  void ExpectShard(const EngineResult &r, const Hashes &want, const std::string &what) {
    EXPECT_EQ(r.error, "") << what;
    ASSERT_FALSE(want.empty());
    EXPECT_EQ(r.hashes.size(), want.size()) << what;
    size_t same = 0;
    for (const auto &[name, hash] : want) {
      auto it = r.hashes.find(name);
      if (it != r.hashes.end() && it->second == hash) {
        same++;
      } else {
        ADD_FAILURE() << what << ": tensor " << name << " differs";
      }
    }
    std::printf("%s: %zu of %zu tensors equal the reference shard\n", what.c_str(), same,
                want.size());
  }

  void PrintDevices() {
    auto st = client_->Status();
    ASSERT_TRUE(st.ok());
    std::printf("%-44s %7s %12s\n", "DEVICE", "ENTRIES", "CACHE_BYTES");
    for (const auto &d : st->devices()) {
      std::printf("%-44s %7u %12llu\n", d.device_uuid().c_str(), d.entries(),
                  static_cast<unsigned long long>(d.cache_bytes()));
    }
    for (const auto &e : st->entries()) {
      std::printf("  rank %u/%u on %s (%s, %s)\n", e.layout().tp_rank(), e.layout().tp_size(),
                  e.device_uuid().c_str(), e.source().c_str(), e.state().c_str());
    }
  }

  std::string PeerCopyLogLine() const {
    std::istringstream in(Log());
    std::string line;
    while (std::getline(in, line)) {
      if (line.find("peer copy of") != std::string::npos) return line;
    }
    return "";
  }

  TempDir dir_;
  std::vector<memory::DeviceInfo> devices_;
  int can_peer_ = 0;
  std::string socket_dir_, log_;
  std::unique_ptr<Process> daemon_;
  std::unique_ptr<client::Client> client_;
};

TEST_F(MultiGpuTest, EachEngineMapsItsRankOnItsGpuChosenByUuid) {
  Hashes ref0 = Reference(0), ref1 = Reference(1);
  ASSERT_NE(ref0, ref1);  // the shards differ, so the test can tell them apart
  ASSERT_NO_FATAL_FAILURE(StartDaemon("copy", "copy"));
  auto st = client_->Status();
  ASSERT_TRUE(st.ok());
  std::map<int, std::string> placed;
  for (const auto &e : st->entries()) placed[e.layout().tp_rank()] = e.device_uuid();
  EXPECT_EQ(placed[0], devices_[0].uuid);
  EXPECT_EQ(placed[1], devices_[1].uuid);
  PrintDevices();

  for (int gpu : {0, 1}) {
    EngineResult r = Engine(gpu, gpu);
    EXPECT_EQ(r.visible_count, 1) << "CUDA_VISIBLE_DEVICES=" << gpu;
    EXPECT_EQ(r.visible_uuid,
              devices_[gpu].uuid);  // its device 0 is physical GPU `gpu`
    EXPECT_EQ(r.lease_device, devices_[gpu].uuid);
    ExpectShard(r, gpu == 0 ? ref0 : ref1, "engine on GPU " + std::to_string(gpu));
  }
  // A replicated tensor equals the checkpoint in both ranks.
  const std::string norm = "model.norm.weight";
  ASSERT_TRUE(ref0.count(norm));
  EXPECT_EQ(ref0[norm], CheckpointHash(norm));
  st = client_->Status();
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->acquire_hits(), 2u);
  EXPECT_EQ(st->acquire_peer_copies(), 0u);
}

TEST_F(MultiGpuTest, PeerCopyServesARankCachedOnTheOtherGpu) {
  Hashes ref0 = Reference(0);
  ASSERT_NO_FATAL_FAILURE(StartDaemon("copy", "copy"));
  EngineResult r = Engine(1, 0);  // GPU 1 asks for rank 0, resident on GPU 0 only
  EXPECT_EQ(r.lease_device, devices_[1].uuid);
  ExpectShard(r, ref0, "peer-copied rank 0 on GPU 1");
  auto st = client_->Status();
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->acquire_peer_copies(), 1u);
  int rank0_entries = 0;
  for (const auto &e : st->entries()) {
    if (e.layout().tp_rank() == 0) {
      rank0_entries++;
      if (e.device_uuid() == devices_[1].uuid) {
        EXPECT_EQ(e.source(), "peer");
      }
    }
  }
  EXPECT_EQ(rank0_entries, 2);
  PrintDevices();
  std::string line = PeerCopyLogLine();
  EXPECT_NE(line, "") << Log();
  EXPECT_NE(line.find(can_peer_ ? "route peer" : "route host"), std::string::npos) << line;
  std::printf("cuDeviceCanAccessPeer: %d\ndaemon: %s\n", can_peer_, line.c_str());
  // Asked again: a hit on GPU 1.
  EngineResult again = Engine(1, 0);
  ExpectShard(again, ref0, "rank 0 on GPU 1, second time");
  st = client_->Status();
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->acquire_peer_copies(), 1u);
  EXPECT_EQ(st->acquire_hits(), 1u);
}

TEST_F(MultiGpuTest, HostPolicyStagesTheCopyThroughHostMemory) {
  Hashes ref1 = Reference(1);
  ASSERT_NO_FATAL_FAILURE(StartDaemon("host", "host"));
  EngineResult r = Engine(0, 1);  // GPU 0 asks for rank 1, resident on GPU 1
  EXPECT_EQ(r.lease_device, devices_[0].uuid);
  ExpectShard(r, ref1, "host-staged rank 1 on GPU 0");
  std::string line = PeerCopyLogLine();
  EXPECT_NE(line.find("route host"), std::string::npos) << Log();
  std::printf("daemon: %s\n", line.c_str());
}

TEST_F(MultiGpuTest, MissPolicyRefusesWithoutCopying) {
  ASSERT_NO_FATAL_FAILURE(StartDaemon("miss", "miss"));
  EngineResult r = Engine(1, 0);
  EXPECT_NE(r.error.find("NOT_FOUND"), std::string::npos) << r.error;
  EXPECT_NE(r.error.find(devices_[0].uuid), std::string::npos) << r.error;
  auto st = client_->Status();
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->entries_size(), 2);
  EXPECT_EQ(st->acquire_peer_copies(), 0u);
}

}  // namespace
}  // namespace weightcache
