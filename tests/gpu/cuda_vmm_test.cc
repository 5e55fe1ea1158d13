// GPU tests of the cuda-vmm backend (ctest label `gpu`). Without a usable GPU every test
// that needs one is skipped with the reason; NoGpu.* then checks the degraded mode.
// The other process is tests/gpu/gpu_helper.cc (wc_gpu_helper, next to this binary): a
// child forked after this process initialised CUDA must exec before touching CUDA.
#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "pkg/memory/backend.h"
#include "pkg/memory/cuda_backend.h"
#include "pkg/memory/internal/cuda_segment.h"
#include "pkg/memory/mapping.h"
#include "tests/gpu/fd_channel.h"
#include "tests/gpu/gpu_testkit.h"

namespace weightcache::gputest {
namespace {

using memory::Backend;
using memory::BackendKind;
using memory::Segment;

constexpr uint64_t kMiB = 1ull << 20;

// One backend for the whole binary (creating a CUDA context costs ~0.3 s).
absl::StatusOr<std::unique_ptr<Backend>>& SharedBackend() {
  static auto* b = new absl::StatusOr<std::unique_ptr<Backend>>(memory::MakeCudaBackend());
  return *b;
}

#define REQUIRE_GPU()                                                        \
  if (!SharedBackend().ok()) {                                               \
    GTEST_SKIP() << "no usable GPU: " << SharedBackend().status().message(); \
  }                                                                          \
  [[maybe_unused]] Backend& backend = **SharedBackend()

std::string HelperPath() {
  if (const char* p = std::getenv("WC_GPU_HELPER")) return p;
  char buf[4096];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  std::string self(buf, n > 0 ? static_cast<size_t>(n) : 0);
  return self.substr(0, self.rfind('/') + 1) + "wc_gpu_helper";
}

// A running wc_gpu_helper with our end of its socketpair.
struct Child {
  pid_t pid = -1;
  ScopedFd sock;

  // Waits and returns the exit status (or 128 + signal).
  int Wait() {
    int st = 0;
    while (::waitpid(pid, &st, 0) < 0 && errno == EINTR) {
    }
    pid = -1;
    if (WIFEXITED(st)) return WEXITSTATUS(st);
    if (WIFSIGNALED(st)) return 128 + WTERMSIG(st);
    return -1;
  }
  ~Child() {
    if (pid > 0) {
      ::kill(pid, SIGKILL);
      Wait();
    }
  }
};

std::unique_ptr<Child> Spawn(const std::vector<std::string>& args, const std::string& env = {}) {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) return nullptr;
  std::string path = HelperPath();
  std::vector<char*> argv;
  argv.push_back(path.data());
  std::vector<std::string> copy = args;
  for (auto& a : copy) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::fflush(nullptr);
  pid_t pid = ::fork();
  if (pid == 0) {
    // Only async-signal-safe calls until exec; CUDA must not be touched here.
    // dup2 clears close-on-exec, except when sv[1] is already 3.
    if (sv[1] == 3 ? ::fcntl(3, F_SETFD, 0) < 0 : ::dup2(sv[1], 3) < 0) ::_exit(120);
    if (!env.empty()) ::putenv(const_cast<char*>(env.c_str()));
    ::execv(path.c_str(), argv.data());
    ::_exit(121);
  }
  ::close(sv[1]);
  auto c = std::make_unique<Child>();
  c->pid = pid;
  c->sock.reset(sv[0]);
  return c;
}

std::vector<std::string> Args(const std::string& mode, const std::string& uuid, uint64_t seed,
                              const std::vector<uint64_t>& sizes) {
  std::vector<std::string> a = {mode, uuid, std::to_string(seed)};
  for (auto s : sizes) a.push_back(std::to_string(s));
  return a;
}

// Allocates one segment per size on `uuid`, fills segment i with pattern (seed, i) and seals.
// Segment 1 (if any) is filled through the asynchronous pinned-memory path.
std::vector<std::unique_ptr<Segment>> MakeSealed(Backend& b, const std::string& uuid,
                                                 const std::vector<uint64_t>& sizes,
                                                 uint64_t seed) {
  std::vector<std::unique_ptr<Segment>> out;
  for (size_t i = 0; i < sizes.size(); ++i) {
    auto seg = b.Allocate(uuid, sizes[i], "gpu-test");
    EXPECT_TRUE(seg.ok()) << seg.status();
    if (!seg.ok()) return {};
    Segment& s = **seg;
    EXPECT_EQ(s.size(), sizes[i]);
    if (i == 1) {
      void* pinned = nullptr;
      std::string err = PinnedAlloc(&pinned, s.size());
      EXPECT_EQ(err, "");
      FillPattern(pinned, s.size(), seed, static_cast<uint32_t>(i));
      auto* cs = memory::internal::AsCudaSegment(&s);
      EXPECT_NE(cs, nullptr);
      // Two halves, as a loader would queue chunks.
      EXPECT_TRUE(cs->CopyInAsync(0, pinned, s.size() / 2, nullptr).ok());
      EXPECT_TRUE(cs->CopyInAsync(s.size() / 2, static_cast<char*>(pinned) + s.size() / 2,
                                  s.size() - s.size() / 2, nullptr)
                      .ok());
      EXPECT_TRUE(s.Seal().ok());  // waits for the queued copies
      PinnedFree(pinned);
    } else {
      std::vector<unsigned char> data(s.size());
      FillPattern(data.data(), data.size(), seed, static_cast<uint32_t>(i));
      EXPECT_TRUE(s.CopyIn(0, data.data(), data.size()).ok());
      EXPECT_TRUE(s.Seal().ok());
    }
    out.push_back(std::move(seg).value());
  }
  return out;
}

absl::Status SendSegments(int sock, const std::vector<std::unique_ptr<Segment>>& segs) {
  std::vector<ScopedFd> dups;
  std::vector<int> raw;
  for (auto& s : segs) {
    ScopedFd d(::fcntl(s->fd(), F_DUPFD_CLOEXEC, 0));
    raw.push_back(d.get());
    dups.push_back(std::move(d));
  }
  return SendFds(sock, raw, "");
}

// ---------------------------------------------------------------------------------------

TEST(NoGpu, MakeCudaBackendExplainsWhyAndAutoFallsBackToHost) {
  if (SharedBackend().ok()) GTEST_SKIP() << "a usable GPU is present";
  ASSERT_TRUE(memory::BuiltWithCuda());
  const absl::Status& s = SharedBackend().status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("CUDA driver not usable"), absl::string_view::npos) << s;
  auto a = memory::MakeBackend("auto");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ((*a)->kind(), BackendKind::kHost);
  std::vector<ScopedFd> fds;
  fds.emplace_back(::dup(0));
  auto m = memory::MapReadOnly(BackendKind::kCudaVmm, std::move(fds), {2 * kMiB}, "GPU-x");
  EXPECT_EQ(m.status().code(), absl::StatusCode::kFailedPrecondition) << m.status();
}

TEST(CudaDevices, ListUuidOrdinalNameComputeCapabilityAndMemory) {
  REQUIRE_GPU();
  EXPECT_EQ(backend.kind(), BackendKind::kCudaVmm);
  EXPECT_EQ(backend.granularity(), 2 * kMiB);
  EXPECT_EQ(backend.max_segment_bytes(), 2ull << 30);
  auto devices = backend.Devices();
  ASSERT_FALSE(devices.empty());
  const std::regex uuid_re("^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$");
  std::set<std::string> ours;
  for (size_t i = 0; i < devices.size(); ++i) {
    const auto& d = devices[i];
    std::printf("device %d: %s %s %s total %llu MiB free %llu MiB\n", d.ordinal, d.uuid.c_str(),
                d.name.c_str(), d.compute_capability.c_str(),
                static_cast<unsigned long long>(d.total_bytes >> 20),
                static_cast<unsigned long long>(d.free_bytes >> 20));
    EXPECT_TRUE(std::regex_match(d.uuid, uuid_re)) << d.uuid;
    EXPECT_EQ(d.ordinal, static_cast<int>(i));
    EXPECT_TRUE(std::regex_match(d.compute_capability, std::regex("^sm_[0-9]+$")));
    if (d.name.find("H200") != std::string::npos || d.name.find("H100") != std::string::npos) {
      EXPECT_EQ(d.compute_capability, "sm_90") << d.name;
    }
    EXPECT_GT(d.total_bytes, 0u);
    EXPECT_GT(d.free_bytes, 0u);
    EXPECT_LE(d.free_bytes, d.total_bytes);
    ours.insert(d.uuid);
  }
  // Same UUIDs as nvidia-smi, when it is there (it ignores CUDA_VISIBLE_DEVICES: compare
  // only when that is unset).
  if (std::getenv("CUDA_VISIBLE_DEVICES") == nullptr) {
    if (FILE* f = ::popen("nvidia-smi --query-gpu=uuid --format=csv,noheader 2>/dev/null", "r")) {
      std::set<std::string> smi;
      char line[256];
      while (std::fgets(line, sizeof line, f) != nullptr) {
        std::string u(line);
        while (!u.empty() && (u.back() == '\n' || u.back() == ' ')) u.pop_back();
        if (!u.empty()) smi.insert(u);
      }
      if (::pclose(f) == 0 && !smi.empty()) {
        EXPECT_EQ(ours, smi);
      }
    }
  }
}

TEST(CudaDevices, LookupByUuid) {
  REQUIRE_GPU();
  for (const auto& d : backend.Devices()) {
    auto ordinal = memory::internal::CudaOrdinalOfUuid(d.uuid);
    ASSERT_TRUE(ordinal.ok()) << ordinal.status();
    EXPECT_EQ(*ordinal, d.ordinal);
  }
  const std::string ghost = "GPU-00000000-0000-0000-0000-000000000000";
  auto missing = memory::internal::CudaOrdinalOfUuid(ghost);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find(ghost), absl::string_view::npos);
  auto seg = backend.Allocate(ghost, kMiB, "ghost");
  EXPECT_EQ(seg.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(seg.status().message().find(ghost), absl::string_view::npos) << seg.status();
  std::vector<ScopedFd> fds;
  fds.emplace_back(::dup(0));
  auto m = memory::MapReadOnly(BackendKind::kCudaVmm, std::move(fds), {2 * kMiB}, ghost);
  EXPECT_EQ(m.status().code(), absl::StatusCode::kNotFound) << m.status();
}

TEST(CudaSegment, RoundsUpCopiesSealsAndRefusesWritesAfterwards) {
  REQUIRE_GPU();
  auto seg = backend.Allocate("", 5000, "small");
  ASSERT_TRUE(seg.ok()) << seg.status();
  Segment& s = **seg;
  EXPECT_EQ(s.size(), 2 * kMiB);
  EXPECT_EQ(s.host_data(), nullptr);
  EXPECT_GE(s.fd(), 0);
  EXPECT_EQ(s.device_uuid(), backend.Devices().front().uuid);
  auto* cs = memory::internal::AsCudaSegment(&s);
  ASSERT_NE(cs, nullptr);
  EXPECT_NE(cs->device_ptr(), nullptr);
  EXPECT_EQ(cs->device_ordinal(), 0);
  uint8_t x[16] = {};
  auto oob = s.CopyIn(s.size() - 8, x, sizeof x);
  EXPECT_EQ(oob.code(), absl::StatusCode::kOutOfRange) << oob;
  ASSERT_TRUE(s.CopyIn(0, x, sizeof x).ok());
  int fd_before = s.fd();
  ASSERT_TRUE(s.Seal().ok());
  EXPECT_TRUE(s.sealed());
  EXPECT_EQ(cs->device_ptr(), nullptr);
  EXPECT_EQ(s.fd(), fd_before);  // exported once, kept
  EXPECT_EQ(s.CopyIn(0, x, 1).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(cs->CopyInAsync(0, x, 1, nullptr).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(s.Seal().ok());  // idempotent
}

TEST(CudaSegment, OutOfMemoryNamesTheCallTheDeviceAndTheResult) {
  REQUIRE_GPU();
  const auto d = backend.Devices().front();
  const uint64_t huge = 1ull << 40;  // 1 TiB
  auto seg = backend.Allocate(d.uuid, huge, "huge");
  ASSERT_FALSE(seg.ok());
  std::printf("error: %s\n", seg.status().ToString().c_str());
  EXPECT_EQ(seg.status().code(), absl::StatusCode::kResourceExhausted) << seg.status();
  const std::string want =
      "cuMemCreate(" + std::to_string(huge) + " bytes on " + d.uuid + "): CUDA_ERROR_OUT_OF_MEMORY";
  EXPECT_NE(seg.status().message().find(want), absl::string_view::npos) << seg.status();
  EXPECT_NE(seg.status().message().find("huge"), absl::string_view::npos) << seg.status();
}

TEST(CudaCrossProcess, ChildMapsSeveralSegmentsIntoOneReadOnlyRangeAndReadsTheSameBytes) {
  REQUIRE_GPU();
  const std::string uuid = backend.Devices().front().uuid;
  const std::vector<uint64_t> sizes = {2 * kMiB, 6 * kMiB, 32 * kMiB, 2 * kMiB};
  auto segs = MakeSealed(backend, uuid, sizes, 7);
  ASSERT_EQ(segs.size(), sizes.size());
  auto child = Spawn(Args("check", uuid, 7, sizes));
  ASSERT_NE(child, nullptr);
  ASSERT_TRUE(SendSegments(child->sock.get(), segs).ok());
  EXPECT_EQ(child->Wait(), 0) << "wc_gpu_helper check failed (see its stderr)";
  // A wrong pattern seed must be caught: the check can fail.
  auto liar = Spawn(Args("check", uuid, 8, sizes));
  ASSERT_TRUE(SendSegments(liar->sock.get(), segs).ok());
  EXPECT_EQ(liar->Wait(), 11);
}

TEST(CudaCrossProcess, LookupByUuidWorksUnderCudaVisibleDevices) {
  REQUIRE_GPU();
  const auto devices = backend.Devices();
  const std::string uuid = devices.back().uuid;  // ordinal N-1 here, 0 in the child
  auto segs = MakeSealed(backend, uuid, {4 * kMiB}, 21);
  ASSERT_EQ(segs.size(), 1u);
  auto child = Spawn(Args("check", uuid, 21, {4 * kMiB}), "CUDA_VISIBLE_DEVICES=" + uuid);
  ASSERT_TRUE(SendSegments(child->sock.get(), segs).ok());
  EXPECT_EQ(child->Wait(), 0);
}

TEST(CudaCrossProcess, KernelWriteToReadOnlyMappingFaultsOnlyInTheChild) {
  REQUIRE_GPU();
  const std::string uuid = backend.Devices().front().uuid;
  auto segs = MakeSealed(backend, uuid, {4 * kMiB}, 99);
  ASSERT_EQ(segs.size(), 1u);
  auto writer = Spawn(Args("write-ro", uuid, 99, {4 * kMiB}));
  ASSERT_TRUE(SendSegments(writer->sock.get(), segs).ok());
  EXPECT_EQ(writer->Wait(), 0) << "the write did not fault (13) or mapping failed (10)";
  // The memory is unchanged: another process still reads the pattern...
  auto reader = Spawn(Args("check", uuid, 99, {4 * kMiB}));
  ASSERT_TRUE(SendSegments(reader->sock.get(), segs).ok());
  EXPECT_EQ(reader->Wait(), 0);
  // ...and this process's own context is unharmed.
  auto more = MakeSealed(backend, uuid, {2 * kMiB}, 5);
  EXPECT_EQ(more.size(), 1u);
  EXPECT_FALSE(backend.Devices().empty());
}

// Finding (issue 26): releasing a read-only cuda-vmm mapping unmapped it at once, while this
// process's kernels could still be reading it (an engine freeing a lease with work queued).
// The release now waits for the context's work first, so the kernel below, whose reads start
// 300 ms after its launch, reads the weights and not an unmapped range.
TEST(CudaMapping, ReleasingAMappingWaitsForKernelsStillReadingIt) {
  REQUIRE_GPU();
  const std::string uuid = backend.Devices().front().uuid;
  const std::vector<uint64_t> sizes = {32 * kMiB};
  auto segs = MakeSealed(backend, uuid, sizes, 21);
  ASSERT_EQ(segs.size(), 1u);
  std::vector<ScopedFd> fds;
  fds.emplace_back(::dup(segs[0]->fd()));
  auto m = memory::MapReadOnly(BackendKind::kCudaVmm, std::move(fds), sizes, uuid);
  ASSERT_TRUE(m.ok()) << m.status();
  auto ordinal = memory::internal::CudaOrdinalOfUuid(uuid);
  ASSERT_TRUE(ordinal.ok());
  std::vector<unsigned char> host(sizes[0]);
  FillPattern(host.data(), host.size(), 21, 0);
  const uint64_t want = HostChecksum(host.data(), host.size());
  unsigned long long* result = nullptr;
  ASSERT_EQ(StartDelayedChecksum((*m)->base(0), sizes[0], *ordinal, 300, &result), "");
  m->reset();  // the lease's mapping released while the kernel has not read yet
  uint64_t sum = 0;
  EXPECT_EQ(FinishChecksum(*ordinal, result, &sum), "");
  EXPECT_EQ(sum, want);
}

TEST(CudaCrossProcess, ImporterMappingSurvivesExporterSigkill) {
  REQUIRE_GPU();
  const std::vector<uint64_t> sizes = {8 * kMiB, 2 * kMiB};
  auto exporter = Spawn({"export", "1234", std::to_string(sizes[0]), std::to_string(sizes[1])});
  ASSERT_NE(exporter, nullptr);
  auto got = RecvFds(exporter->sock.get());
  ASSERT_TRUE(got.ok()) << got.status();
  const std::string uuid = got->payload;
  auto m = memory::MapReadOnly(BackendKind::kCudaVmm, std::move(got->fds), sizes, uuid);
  ASSERT_TRUE(m.ok()) << m.status();
  auto ordinal = memory::internal::CudaOrdinalOfUuid(uuid);
  ASSERT_TRUE(ordinal.ok());
  auto verify = [&](const char* when) {
    for (size_t i = 0; i < sizes.size(); ++i) {
      std::vector<unsigned char> host(sizes[i]);
      ASSERT_EQ(CopyToHost(host.data(), (*m)->base(i), sizes[i], *ordinal), "") << when;
      EXPECT_EQ(FirstMismatch(host.data(), sizes[i], 1234, static_cast<uint32_t>(i)), -1)
          << when << ", segment " << i;
    }
  };
  verify("before the exporter's death");
  ASSERT_EQ(::kill(exporter->pid, SIGKILL), 0);
  EXPECT_EQ(exporter->Wait(), 128 + SIGKILL);
  verify("after the exporter's SIGKILL");
}

TEST(CudaCrossProcess, HeldDescriptorsKeepMemoryForANewImporterAfterExporterSigkill) {
  REQUIRE_GPU();
  // The keeper's role: a holder of the FDs (here this process, which never imports them)
  // keeps the memory alive after the exporter dies, and a new process maps it again.
  const std::vector<uint64_t> sizes = {4 * kMiB, 2 * kMiB};
  auto exporter = Spawn({"export", "77", std::to_string(sizes[0]), std::to_string(sizes[1])});
  ASSERT_NE(exporter, nullptr);
  auto got = RecvFds(exporter->sock.get());
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(::kill(exporter->pid, SIGKILL), 0);
  EXPECT_EQ(exporter->Wait(), 128 + SIGKILL);
  auto reader = Spawn(Args("check", got->payload, 77, sizes));
  std::vector<int> raw;
  for (auto& f : got->fds) raw.push_back(f.get());
  ASSERT_TRUE(SendFds(reader->sock.get(), raw, "").ok());
  EXPECT_EQ(reader->Wait(), 0);
}

}  // namespace
}  // namespace weightcache::gputest
