#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstring>
#include <numeric>

#include "gtest/gtest.h"
#include "pkg/memory/backend.h"
#include "pkg/memory/cuda_backend.h"
#include "pkg/memory/mapping.h"

namespace weightcache::memory {
namespace {

std::unique_ptr<Segment> FilledSegment(Backend& b, uint64_t size) {
  auto seg = b.Allocate("", size, "test-seg");
  EXPECT_TRUE(seg.ok()) << seg.status();
  std::vector<uint8_t> data(size);
  std::iota(data.begin(), data.end(), 0);
  EXPECT_TRUE((*seg)->CopyIn(0, data.data(), data.size()).ok());
  return std::move(seg).value();
}

TEST(HostBackend, AllocatesRoundedSealsAndSharesReadOnly) {
  auto b = MakeHostBackend();
  auto seg = FilledSegment(*b, 5000);
  EXPECT_EQ(seg->size() % b->granularity(), 0u);
  ASSERT_NE(seg->host_data(), nullptr);
  ASSERT_TRUE(seg->Seal().ok());
  EXPECT_TRUE(seg->sealed());
  EXPECT_EQ(seg->host_data(), nullptr);
  int seals = ::fcntl(seg->fd(), F_GET_SEALS);
  EXPECT_EQ(seals & (F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL),
            F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
  // The shared descriptor is read-only: no writable mapping, no write, no resize.
  EXPECT_EQ(::fcntl(seg->fd(), F_GETFL) & O_ACCMODE, O_RDONLY);
  void* w = ::mmap(nullptr, seg->size(), PROT_READ | PROT_WRITE, MAP_SHARED, seg->fd(), 0);
  EXPECT_EQ(w, MAP_FAILED);
  EXPECT_EQ(::ftruncate(seg->fd(), 0), -1);
  uint8_t x = 1;
  EXPECT_EQ(::pwrite(seg->fd(), &x, 1, 0), -1);
  // After sealing, writes through the backend are refused too.
  EXPECT_EQ(seg->CopyIn(0, &x, 1).code(), absl::StatusCode::kFailedPrecondition);
}

TEST(HostBackend, CopyOutsideSegmentIsRefused) {
  auto b = MakeHostBackend();
  auto seg = b->Allocate("", 100, "small");
  ASSERT_TRUE(seg.ok());
  uint8_t x[16] = {};
  auto s = (*seg)->CopyIn((*seg)->size() - 8, x, sizeof x);
  EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange);
  EXPECT_NE(s.message().find("outside segment"), absl::string_view::npos) << s;
}

TEST(HostBackend, UnknownDeviceAndEmptySizeAreErrors) {
  auto b = MakeHostBackend();
  auto s1 = b->Allocate("GPU-123", 100, "x");
  EXPECT_EQ(s1.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s1.status().message().find("GPU-123"), absl::string_view::npos);
  EXPECT_EQ(b->Allocate("", 0, "x").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(HostMapping, MapsSameBytesReadOnly) {
  auto b = MakeHostBackend();
  auto seg = FilledSegment(*b, 3 << 20);
  ASSERT_TRUE(seg->Seal().ok());
  std::vector<ScopedFd> fds;
  fds.emplace_back(::dup(seg->fd()));
  auto m = MapReadOnly(BackendKind::kHost, std::move(fds), {seg->size()}, "");
  ASSERT_TRUE(m.ok()) << m.status();
  const auto* p = reinterpret_cast<const uint8_t*>((*m)->base(0));
  for (size_t i = 0; i < (3u << 20); i += 4099) ASSERT_EQ(p[i], static_cast<uint8_t>(i));
  // mprotect to writable fails: the descriptor is read-only.
  EXPECT_NE(::mprotect(const_cast<uint8_t*>(p), 4096, PROT_READ | PROT_WRITE), 0);
  // A write faults (in a child, so the test survives).
  pid_t pid = ::fork();
  if (pid == 0) {
    const_cast<volatile uint8_t*>(p)[0] = 7;
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFSIGNALED(status));
  EXPECT_EQ(WTERMSIG(status), SIGSEGV);
  EXPECT_EQ(p[0], 0);
}

TEST(HostMapping, CountMismatchIsAnError) {
  auto m = MapReadOnly(BackendKind::kHost, {}, {4096}, "");
  EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(BackendSelection, AutoFallsBackToHostAndUnknownNameIsRejected) {
  auto a = MakeBackend("auto");
  ASSERT_TRUE(a.ok()) << a.status();
  if (!BuiltWithCuda()) {
    EXPECT_EQ((*a)->kind(), BackendKind::kHost);
  }
  auto h = MakeBackend("host");
  ASSERT_TRUE(h.ok());
  EXPECT_EQ((*h)->kind(), BackendKind::kHost);
  auto bad = MakeBackend("tpu");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("tpu"), absl::string_view::npos);
}

}  // namespace
}  // namespace weightcache::memory
