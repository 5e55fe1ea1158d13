// The whole stack on a GPU (ctest label `gpu`): weightcached with the cuda-vmm backend and
// engine processes (wc_gpu_client) that map its memory read-only through the client library.
// Skipped, with the reason, where no usable GPU is present.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>

#include "pkg/client/client.h"
#include "pkg/memory/cuda_backend.h"
#include "pkg/safetensors/writer.h"
#include "tests/gpu/gpu_testkit.h"
#include "tests/integration/daemon_harness.h"
#include "tests/integration/process.h"
#include "tests/testutil/temp_dir.h"
#include "weightcache/v1/weightcache.pb.h"

namespace weightcache {
namespace {

using namespace std::chrono_literals;
using testing::Process;

// Binaries next to this test (ctest and the carried layout alike), or from the environment.
std::string Sibling(const char* env, const std::string& name) {
  if (const char* p = std::getenv(env); p != nullptr && *p != '\0') return p;
  return (std::filesystem::canonical("/proc/self/exe").parent_path() / name).string();
}
std::string DaemonPath() {
  if (const char* p = std::getenv("WEIGHTCACHED"); p != nullptr && *p != '\0') return p;
#ifdef WEIGHTCACHED_PATH
  return WEIGHTCACHED_PATH;
#else
  return Sibling("WEIGHTCACHED", "weightcached");
#endif
}

// ~1.2 GiB of seeded bf16 with Llama tensor names: large enough that a second copy would
// show in cudaMemGetInfo next to the engines' own contexts (~0.5 GiB each).
safetensors::LlamaShape Big() {
  safetensors::LlamaShape s;
  s.layers = 2;
  s.hidden = 4096;
  s.intermediate = 11008;
  s.heads = 32;
  s.kv_heads = 8;
  s.vocab = 32000;
  return s;
}

class StackGpuTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto backend = memory::MakeCudaBackend({});
    if (!backend.ok()) {
      skip_ = "no usable GPU: " + backend.status().ToString();
      return;
    }
    uuid_ = (*backend)->Devices().at(0).uuid;
    ordinal_ = (*backend)->Devices().at(0).ordinal;
    dir_ = new testing::TempDir();
    ::chmod(dir_->path().c_str(), 0755);  // the other-uid engine reads the checkpoint
    auto s = safetensors::WriteLlamaCheckpoint(*dir_ / "big", Big());
    ASSERT_TRUE(s.ok()) << s;
    for (const auto& e : std::filesystem::recursive_directory_iterator(dir_->path())) {
      ::chmod(e.path().c_str(), e.is_directory() ? 0755 : 0644);
    }
    model_bytes_ = 0;
    for (const auto& e : std::filesystem::directory_iterator(*dir_ / "big")) {
      model_bytes_ += e.file_size();
    }
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }

  void SetUp() override {
    if (!skip_.empty()) GTEST_SKIP() << skip_;
    socket_dir_ = *dir_ / ("s" + std::to_string(++counter_));
  }
  void TearDown() override {
    clients_.clear();
    daemon_.reset();
  }

  void StartDaemon(bool preload, const std::vector<std::string>& extra = {}) {
    std::vector<std::string> argv{DaemonPath(),
                                  "--socket_dir=" + socket_dir_,
                                  "--backend=cuda",
                                  "--metrics_address=off",
                                  "--model=name=big,model_dir=" + *dir_ / "big",
                                  std::string("--preload=") + (preload ? "true" : "false")};
    argv.insert(argv.end(), extra.begin(), extra.end());
    auto d = testing::StartDaemon(
        argv, socket_dir_, socket_dir_ + ".daemon.log",
        [preload](const v1::StatusResponse& st) {
          return !preload || (st.entries_size() == 1 && st.entries(0).state() == "ready");
        },
        120s);
    ASSERT_TRUE(d.ok()) << d.status();
    daemon_ = std::move(d->process);
    control_ = std::move(d->client);
    auto st = control_->Status();
    ASSERT_TRUE(st.ok()) << st.status();
    ASSERT_EQ(st->backend(), "cuda-vmm");
  }

  // Starts an engine (optionally under `wrapper`), reads its report until READY.
  struct Engine {
    std::unique_ptr<Process> p;
    std::string ids;
    uint64_t context_free = 0, mapped_free = 0;
    std::string bytes;
  };
  Engine StartEngine(const std::vector<std::string>& wrapper = {}) {
    std::vector<std::string> argv = wrapper;
    argv.insert(argv.end(), {Sibling("WC_GPU_CLIENT", "wc_gpu_client"), socket_dir_, "big", uuid_});
    Engine e;
    e.p = std::make_unique<Process>(argv, socket_dir_ + ".client.log");
    auto deadline = std::chrono::steady_clock::now() + 120s;
    while (std::chrono::steady_clock::now() < deadline) {
      auto line = e.p->ReadLine(60s);
      if (!line) break;
      if (line->rfind("IDS ", 0) == 0) e.ids = line->substr(4);
      if (line->rfind("CONTEXT_FREE ", 0) == 0) e.context_free = std::stoull(line->substr(13));
      if (line->rfind("MAPPED_FREE ", 0) == 0) e.mapped_free = std::stoull(line->substr(12));
      if (line->rfind("BYTES ", 0) == 0) e.bytes = *line;
      if (line->rfind("ERROR", 0) == 0) {
        ADD_FAILURE() << *line;
        break;
      }
      if (*line == "READY") break;
    }
    return e;
  }

  void CheckWrappedEngine(const std::vector<std::string>& wrapper, const std::string& ids, int uid);

  uint64_t FreeBytes() {
    uint64_t f = 0, t = 0;
    EXPECT_EQ(gputest::MemInfo(ordinal_, &f, &t), "");
    return f;
  }

  static inline std::string skip_;
  static inline std::string uuid_;
  static inline int ordinal_ = 0;
  static inline testing::TempDir* dir_ = nullptr;
  static inline uint64_t model_bytes_ = 0;
  static inline int counter_ = 0;
  std::string socket_dir_;
  std::unique_ptr<Process> daemon_;
  std::unique_ptr<client::Client> control_;
  std::vector<Engine> clients_;
};

// The checkpoint's bytes of tensor `name` (big is bf16: served as stored).
std::string FileBytes(const std::string& dir, const std::string& name) {
  return testing::CheckpointTensorBytes(dir, name);
}

// Issue 27: an engine imports a segment read-write (cuda-vmm cannot stop it) and changes one
// byte of everyone's weights. The scrubber finds it within its interval, the entry leaves
// service, the engine that held a lease is told, and a new Acquire maps a clean reload.
TEST_F(StackGpuTest, AByteChangedThroughAWritableImportIsFoundAndACleanCopyServes) {
  constexpr double kInterval = 1.0;  // --scrub_interval
  StartDaemon(true, {"--scrub_interval=1"});
  client::AcquireOptions o;
  o.model = "big";
  o.wait_ready = true;
  auto held = control_->Acquire(o);
  ASSERT_TRUE(held.ok()) << held.status();
  ASSERT_TRUE((*held)->Check().ok());
  // The victim: a tensor in the middle of segment 0, one byte in its middle.
  const client::TensorView* victim = nullptr;
  for (const auto& t : (*held)->tensors()) {
    if (t.segment == 0 && t.nbytes > 4096 && (victim == nullptr || t.nbytes > victim->nbytes)) {
      victim = &t;
    }
  }
  ASSERT_NE(victim, nullptr);
  const uint64_t at = victim->offset + victim->nbytes / 2;
  const std::string disk = FileBytes(*dir_ / "big", victim->name);
  ASSERT_EQ(disk.size(), victim->nbytes);
  auto read = [&](const client::TensorView& t) {
    std::string b(t.nbytes, '\0');
    EXPECT_EQ(gputest::CopyToHost(b.data(), t.data, t.nbytes, ordinal_), "");
    return b;
  };
  ASSERT_EQ(read(*victim), disk);
  ASSERT_NE(disk[victim->nbytes / 2], '\xff');

  Process attacker({Sibling("WC_GPU_ATTACKER", "wc_gpu_attacker"), socket_dir_, "big", "0",
                    std::to_string(at), "1"},
                   socket_dir_ + ".attacker.log");
  ASSERT_EQ(attacker.Wait(), 0) << testing::ReadFileOrEmpty(socket_dir_ + ".attacker.log");
  const auto written = std::chrono::steady_clock::now();
  const std::string changed = read(*victim);
  size_t diffs = 0;
  for (size_t i = 0; i < disk.size(); ++i) diffs += changed[i] != disk[i] ? 1 : 0;
  ASSERT_EQ(diffs, 1u) << "the attack changed everyone's weights: that is what must be found";

  // A pass starts every interval and reads the 1.3 GiB at <= 50 GB/s (about 27 ms), so the
  // change is found within two intervals of the write; 10 s more for a slow machine.
  const absl::Status told =
      (*held)->Check(std::chrono::milliseconds(static_cast<int64_t>((2 * kInterval + 10) * 1000)));
  const double found_after =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - written).count();
  ASSERT_EQ(told.code(), absl::StatusCode::kDataLoss) << told;
  EXPECT_THAT(std::string(told.message()), ::testing::HasSubstr("segment 0 of"));
  const uint64_t chunk = at / (1 << 20) * (1 << 20);
  EXPECT_THAT(std::string(told.message()),
              ::testing::HasSubstr("bytes [" + std::to_string(chunk) + ", " +
                                   std::to_string(chunk + (1 << 20)) + ") changed"));
  std::printf("INTEGRITY found a 1-byte write %.3f s after it (scrub interval %.1f s)\n",
              found_after, kInterval);
  EXPECT_LE(found_after, 2 * kInterval + 10);

  // New Acquires get a clean copy (loaded again from the checkpoint).
  std::unique_ptr<client::Lease> fresh;
  const auto t0 = std::chrono::steady_clock::now();
  while (fresh == nullptr && std::chrono::steady_clock::now() - t0 < 120s) {
    auto l = control_->Acquire(o);
    if (l.ok()) fresh = std::move(l).value();
  }
  ASSERT_NE(fresh, nullptr);
  EXPECT_TRUE(fresh->Check().ok());
  std::printf("INTEGRITY clean copy served %.3f s after the finding\n",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - written).count() -
                  found_after);
  size_t checked = 0;
  for (const auto& t : fresh->tensors()) {
    ASSERT_EQ(read(t), FileBytes(*dir_ / "big", t.name)) << t.name;
    ++checked;
  }
  EXPECT_EQ(checked, (*held)->tensors().size());
  auto st = control_->Status();
  ASSERT_TRUE(st.ok());
  int corrupt = 0;
  for (const auto& e : st->entries()) corrupt += e.state() == "corrupt" ? 1 : 0;
  EXPECT_EQ(corrupt, 1);  // held by our first lease until it ends
}

TEST_F(StackGpuTest, TwoEnginesMapOneCopyWithTheCheckpointsBytes) {
  const uint64_t before = FreeBytes();  // this process's context exists from here on
  ASSERT_NO_FATAL_FAILURE(StartDaemon(/*preload=*/false));
  ASSERT_TRUE(control_->Load("big", "", nullptr).ok());
  const uint64_t loaded = FreeBytes();
  // One copy: the model (rounded to 2 MiB segments) plus the daemon's own context.
  EXPECT_GE(before - loaded, model_bytes_ * 9 / 10);
  EXPECT_LT(before - loaded, model_bytes_ + (1ull << 30));

  for (int i = 0; i < 2; ++i) {
    auto e = StartEngine();
    EXPECT_EQ(e.bytes, "BYTES OK");
    // Mapping adds no memory: free bytes after mapping ~ free bytes with the context alone.
    EXPECT_LT(e.context_free - e.mapped_free, 64ull << 20)
        << "engine " << i << " mapping used " << (e.context_free - e.mapped_free) << " bytes";
    clients_.push_back(std::move(e));
  }
  const uint64_t mapped = FreeBytes();
  // Daemon + 2 engines: one copy and three contexts, far below three copies.
  EXPECT_LT(before - mapped, model_bytes_ + (3ull << 30)) << "model " << model_bytes_;
  auto st = control_->Status();
  ASSERT_TRUE(st.ok());
  ASSERT_EQ(st->entries_size(), 1);
  EXPECT_EQ(st->entries(0).lease_count(), 2u);  // the two engines'
  EXPECT_EQ(st->entries(0).device_uuid(), uuid_);
  std::printf("free MiB: before %llu, loaded %llu, two engines mapped %llu (model %llu MiB)\n",
              static_cast<unsigned long long>(before >> 20),
              static_cast<unsigned long long>(loaded >> 20),
              static_cast<unsigned long long>(mapped >> 20),
              static_cast<unsigned long long>(model_bytes_ >> 20));
}

TEST_F(StackGpuTest, KernelWriteFaultsInThatEngineOnlyAndOthersStillReadTheWeights) {
  ASSERT_NO_FATAL_FAILURE(StartDaemon(/*preload=*/true));
  auto a = StartEngine();
  auto b = StartEngine();
  ASSERT_EQ(a.bytes, "BYTES OK");
  ASSERT_EQ(b.bytes, "BYTES OK");
  ASSERT_TRUE(a.p->WriteLine("write"));
  auto w = a.p->WaitFor("WRITE", 60s);
  ASSERT_TRUE(w.has_value());
  EXPECT_EQ(*w, "WRITE FAULTED cudaErrorIllegalAddress");
  ASSERT_TRUE(b.p->WriteLine("check"));
  EXPECT_EQ(b.p->WaitFor("BYTES", 60s).value_or("none"), "BYTES OK");
  auto c = StartEngine();  // the daemon still serves correct weights to a new engine
  EXPECT_EQ(c.bytes, "BYTES OK");
}

TEST_F(StackGpuTest, EngineKeepsComputingOnCorrectWeightsAfterDaemonSigkill) {
  ASSERT_NO_FATAL_FAILURE(StartDaemon(/*preload=*/true));
  auto a = StartEngine();
  ASSERT_EQ(a.bytes, "BYTES OK");
  control_.reset();
  daemon_->Kill(SIGKILL);
  daemon_->Wait();
  ASSERT_TRUE(a.p->WriteLine("check"));
  EXPECT_EQ(a.p->WaitFor("BYTES", 60s).value_or("none"), "BYTES OK");
}

// An engine in other namespaces and/or as another uid: `wrapper` runs it; `ids` is what it
// must report about itself.
void StackGpuTest::CheckWrappedEngine(const std::vector<std::string>& wrapper,
                                      const std::string& ids, int uid) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to create namespaces and switch uid";
  std::string probe;
  for (const auto& w : wrapper) probe += w + " ";
  if (std::system((probe + "true").c_str()) != 0) GTEST_SKIP() << "not usable here: " << probe;
  ASSERT_NO_FATAL_FAILURE(StartDaemon(/*preload=*/true));
  // The daemon makes its socket dir 0750 and sockets 0660 (root's); open them to the
  // engine's uid for this test (a deployment uses group ownership or --allowed_uids).
  ::chmod(socket_dir_.c_str(), 0755);
  ::chmod((socket_dir_ + "/control.sock").c_str(), 0666);
  ::chmod((socket_dir_ + "/handle.sock").c_str(), 0666);
  auto e = StartEngine(wrapper);
  if (ids.back() == '=') {
    EXPECT_EQ(e.ids.rfind(ids, 0), 0u) << e.ids;
  } else {
    EXPECT_EQ(e.ids, ids);
  }
  EXPECT_EQ(e.bytes, "BYTES OK");
  // The engine's lease, by its uid: only an admin sees another process's leases.
  auto st = testing::AdminClient(socket_dir_)->Status();
  ASSERT_TRUE(st.ok());
  ASSERT_EQ(st->entries_size(), 1);
  ASSERT_EQ(st->entries(0).leases_size(), 1);
  EXPECT_EQ(st->entries(0).leases(0).uid(), uid);
}

TEST_F(StackGpuTest, EngineInOtherPidIpcMountNamespacesMapsAndReads) {
  // PID 1 of a fresh PID namespace, with its own IPC and mount namespaces and its own /proc,
  // as in a container. (Without --mount-proc, the host's /proc in a new PID namespace makes
  // cuInit itself fail with CUDA_ERROR_OPERATING_SYSTEM on the H200 machine: no container
  // runs like that.)
  CheckWrappedEngine({"/usr/bin/unshare", "--pid", "--ipc", "--mount", "--fork", "--mount-proc"},
                     "uid=0 pid=1", 0);
}

TEST_F(StackGpuTest, EngineAsAnotherUidMapsAndReads) {
  CheckWrappedEngine({"/usr/bin/setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"},
                     "uid=65534 pid=" /* any */, 65534);
}

TEST_F(StackGpuTest, EngineInOtherNamespacesAndAsAnotherUidMapsAndReads) {
  CheckWrappedEngine({"/usr/bin/unshare", "--pid", "--ipc", "--mount", "--fork", "--mount-proc",
                      "/usr/bin/setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"},
                     "uid=65534 pid=1", 65534);
}

}  // namespace
}  // namespace weightcache
