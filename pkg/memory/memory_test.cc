#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstring>
#include <numeric>

#include "gtest/gtest.h"
#include "pkg/memory/backend.h"
#include "pkg/memory/cuda_backend.h"
#include "pkg/memory/mapping.h"
#include "pkg/util/scoped_fd.h"

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

// Finding (issue 25): memory a client kept after its lease ended was not counted, so one
// pod multiplied real use past the budget by evict-and-reload (Status 124 MiB, shared
// memory 884 MiB, budget 150 MiB). A dropped segment now counts until its last holder (a
// descriptor, a mapping, a re-open through /proc) lets go.
TEST(HostBackend, ADroppedSegmentCountsUntilItsLastHolderLetsGo) {
  auto b = MakeHostBackend();
  for (const std::string hold : {"descriptor", "mapping", "reopen"}) {
    SCOPED_TRACE(hold);
    auto seg = FilledSegment(*b, 5000);
    ASSERT_TRUE(seg->Seal().ok());
    const uint64_t size = seg->size();
    ScopedFd kept(::dup(seg->fd()));  // what a client received over the handle channel
    void* map = nullptr;
    ScopedFd reopened;
    if (hold == "mapping") {
      map = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, kept.get(), 0);
      ASSERT_NE(map, MAP_FAILED);
      kept.reset();  // the mapping alone holds it
    } else if (hold == "reopen") {
      const std::string self = "/proc/self/fd/" + std::to_string(kept.get());
      reopened = ScopedFd(::open(self.c_str(), O_RDONLY | O_CLOEXEC));
      ASSERT_TRUE(reopened.valid());
    }
    EXPECT_EQ(b->LingeringBytes("host"), 0u);  // the daemon still holds it: not lingering
    seg.reset();                               // evicted: the daemon lets go
    EXPECT_EQ(b->LingeringBytes("host"), size);
    EXPECT_EQ(b->LingeringBytes("other"), 0u);
    if (hold == "reopen") {
      kept.reset();  // the received descriptor closed; the re-opened one still holds it
      EXPECT_EQ(b->LingeringBytes("host"), size);
      reopened.reset();
    }
    kept.reset();
    if (map != nullptr) {
      EXPECT_EQ(b->LingeringBytes("host"), size);
      ::munmap(map, size);
    }
    EXPECT_EQ(b->LingeringBytes("host"), 0u);
  }
  // Nobody else held it: not lingering at all.
  auto alone = FilledSegment(*b, 5000);
  ASSERT_TRUE(alone->Seal().ok());
  alone.reset();
  EXPECT_EQ(b->LingeringBytes("host"), 0u);
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

// The test-only "two devices" host backend: real memfds labelled with fake device UUIDs.
TEST(HostBackend, FakeDevicesPlaceSegmentsAndCopyBetweenThem) {
  HostBackendOptions o;
  o.device_uuids = {"host-a", "host-b"};
  auto b = MakeHostBackend(o);
  auto devices = b->Devices();
  ASSERT_EQ(devices.size(), 2u);
  EXPECT_EQ(devices[0].uuid, "host-a");
  EXPECT_EQ(devices[1].uuid, "host-b");
  EXPECT_EQ(b->Allocate("host", 100, "x").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(b->CanAccessPeer("host-a", "host-b"));
  EXPECT_FALSE(b->CanAccessPeer("host-a", "GPU-x"));

  auto src = b->Allocate("host-a", 5000, "src");
  ASSERT_TRUE(src.ok()) << src.status();
  EXPECT_EQ((*src)->device_uuid(), "host-a");
  std::vector<uint8_t> data((*src)->size());
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint8_t>(i * 7 + 3);
  ASSERT_TRUE((*src)->CopyIn(0, data.data(), data.size()).ok());
  ASSERT_TRUE((*src)->Seal().ok());
  for (CopyRoute route : {CopyRoute::kPeer, CopyRoute::kHostStaged}) {
    auto dst = b->Allocate("host-b", 5000, "dst");
    ASSERT_TRUE(dst.ok());
    EXPECT_EQ((*dst)->device_uuid(), "host-b");
    ASSERT_TRUE(b->CopySegment(**src, dst->get(), route, {}).ok()) << CopyRouteName(route);
    EXPECT_EQ(std::memcmp((*dst)->host_data(), data.data(), data.size()), 0)
        << CopyRouteName(route);
    ASSERT_TRUE((*dst)->Seal().ok());
    // Into a sealed segment: refused.
    EXPECT_EQ(b->CopySegment(**src, dst->get(), route, {}).code(),
              absl::StatusCode::kFailedPrecondition);
  }
  // Into a smaller segment: refused.
  auto small = b->Allocate("host-b", 100, "small");
  auto big = b->Allocate("host-a", 3 << 20, "big");
  ASSERT_TRUE(small.ok() && big.ok());
  EXPECT_EQ(b->CopySegment(**big, small->get(), CopyRoute::kPeer, {}).code(),
            absl::StatusCode::kInvalidArgument);
}

// A copy is cancellable per chunk (a daemon shutdown during a peer copy of a large segment
// waited for the whole segment): the tick sees each chunk's start, and a false stops the
// copy there with CANCELLED, the destination holding exactly the chunks before it.
TEST(HostBackend, CopyStopsAtTheChunkWhereTheTickSaysStop) {
  HostBackendOptions o;
  o.device_uuids = {"host-a", "host-b"};
  auto b = MakeHostBackend(o);
  const uint64_t size = 3 * kCopyChunkBytes + 4096;
  auto src = FilledSegment(*b, size);  // byte i is i mod 256
  ASSERT_TRUE(src->Seal().ok());
  std::vector<uint8_t> want(size);
  std::iota(want.begin(), want.end(), 0);
  for (CopyRoute route : {CopyRoute::kPeer, CopyRoute::kHostStaged}) {
    auto dst = b->Allocate("host-b", size, "dst");
    ASSERT_TRUE(dst.ok());
    std::vector<uint64_t> seen;
    const CopyTick all = [&seen](uint64_t copied) {
      seen.push_back(copied);
      return true;
    };
    ASSERT_TRUE(b->CopySegment(*src, dst->get(), route, all).ok());
    EXPECT_EQ(seen,
              (std::vector<uint64_t>{0, kCopyChunkBytes, 2 * kCopyChunkBytes, 3 * kCopyChunkBytes}))
        << CopyRouteName(route);
    EXPECT_EQ(std::memcmp((*dst)->host_data(), want.data(), size), 0);

    auto part = b->Allocate("host-b", size, "part");
    ASSERT_TRUE(part.ok());
    const CopyTick two = [](uint64_t copied) { return copied < 2 * kCopyChunkBytes; };
    auto s = b->CopySegment(*src, part->get(), route, two);
    EXPECT_EQ(s.code(), absl::StatusCode::kCancelled) << CopyRouteName(route) << ": " << s;
    EXPECT_NE(s.message().find("host-b"), absl::string_view::npos) << s;
    EXPECT_EQ(std::memcmp((*part)->host_data(), want.data(), 2 * kCopyChunkBytes), 0);
    // Not one byte of the third chunk (the source's bytes there are not zero).
    const std::vector<std::byte> zeros(kCopyChunkBytes);
    EXPECT_EQ(
        std::memcmp((*part)->host_data() + 2 * kCopyChunkBytes, zeros.data(), kCopyChunkBytes), 0);
  }
}

TEST(HostBackend, WithoutPeerAccessOnlyHostStagedCopiesRun) {
  HostBackendOptions o;
  o.device_uuids = {"host-a", "host-b"};
  o.peer_access = false;
  auto b = MakeHostBackend(o);
  EXPECT_FALSE(b->CanAccessPeer("host-a", "host-b"));
  EXPECT_TRUE(b->CanAccessPeer("host-a", "host-a"));
  auto src = FilledSegment(*b, 4096);  // on the first device, host-a
  ASSERT_TRUE(src->Seal().ok());
  auto dst = b->Allocate("host-b", 4096, "dst");
  ASSERT_TRUE(dst.ok());
  auto peer = b->CopySegment(*src, dst->get(), CopyRoute::kPeer, {});
  EXPECT_EQ(peer.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(peer.message().find("host-a"), absl::string_view::npos) << peer;
  ASSERT_TRUE(b->CopySegment(*src, dst->get(), CopyRoute::kHostStaged, {}).ok());
  EXPECT_EQ(static_cast<uint8_t>((*dst)->host_data()[4095]), static_cast<uint8_t>(4095));
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
    std::signal(SIGSEGV, SIG_DFL);  // die by the signal, not a sanitizer's handler
    const_cast<volatile uint8_t*>(p)[0] = 7;
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFSIGNALED(status));
  EXPECT_EQ(WTERMSIG(status), SIGSEGV);
  EXPECT_EQ(p[0], 0);
}

// The /proc/self/maps line of the mapping that holds `p`, or "" when none does.
std::string MapsLineOf(const void* p) {
  FILE* f = std::fopen("/proc/self/maps", "r");
  if (f == nullptr) return "";
  char line[512];
  std::string found;
  const auto at = reinterpret_cast<uintptr_t>(p);
  while (std::fgets(line, sizeof line, f) != nullptr) {
    unsigned long lo = 0, hi = 0;
    if (std::sscanf(line, "%lx-%lx", &lo, &hi) == 2 && lo <= at && at < hi) found = line;
  }
  std::fclose(f);
  return found;
}

// Whether reading one byte at `p` kills a child with SIGSEGV.
bool ReadFaults(const void* p) {
  pid_t pid = ::fork();
  if (pid == 0) {
    std::signal(SIGSEGV, SIG_DFL);
    volatile uint8_t x = *static_cast<const volatile uint8_t*>(p);
    (void)x;
    _exit(0);
  }
  int status = 0;
  if (::waitpid(pid, &status, 0) != pid) return false;
  return WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV;
}

// Sleep and wake at the mapping level: Detach lets go of the memory (the daemon's evicted
// segment lingers no more), keeps the ranges reserved PROT_NONE at the same addresses, and
// Reattach maps new descriptors of the same sizes there.
TEST(HostMapping, DetachReservesTheRangesAndReattachMapsTheSameAddresses) {
  auto b = MakeHostBackend();
  auto a = FilledSegment(*b, 3 << 20);
  auto c = FilledSegment(*b, 5000);
  ASSERT_TRUE(a->Seal().ok());
  ASSERT_TRUE(c->Seal().ok());
  const std::vector<uint64_t> sizes{a->size(), c->size()};
  std::vector<ScopedFd> fds;
  fds.emplace_back(::dup(a->fd()));
  fds.emplace_back(::dup(c->fd()));
  auto m = MapReadOnly(BackendKind::kHost, std::move(fds), sizes, "");
  ASSERT_TRUE(m.ok()) << m.status();
  const std::byte* base0 = (*m)->base(0);
  const std::byte* base1 = (*m)->base(1);
  EXPECT_NE(MapsLineOf(base0).find(" r--s "), std::string::npos) << MapsLineOf(base0);
  EXPECT_EQ((*m)->Reattach({}, sizes).code(), absl::StatusCode::kFailedPrecondition);

  ASSERT_TRUE((*m)->Detach().ok());
  EXPECT_FALSE((*m)->attached());
  EXPECT_TRUE((*m)->Detach().ok());  // twice: a no-op
  EXPECT_EQ((*m)->base(0), base0);
  EXPECT_EQ((*m)->base(1), base1);
  for (const std::byte* p : {base0, base1}) {
    const std::string line = MapsLineOf(p);
    EXPECT_NE(line.find(" ---p "), std::string::npos) << line;  // reserved, inaccessible
    EXPECT_EQ(line.find("memfd"), std::string::npos) << line;
    EXPECT_TRUE(ReadFaults(p));
  }
  // Evicted by the daemon: nothing of this process holds the memory any more.
  a.reset();
  c.reset();
  EXPECT_EQ(b->LingeringBytes("host"), 0u);

  // Another copy of the same weights (a reload) comes back at the same addresses.
  auto a2 = FilledSegment(*b, 3 << 20);
  auto c2 = FilledSegment(*b, 5000);
  ASSERT_TRUE(a2->Seal().ok());
  ASSERT_TRUE(c2->Seal().ok());
  auto fds_of = [&] {
    std::vector<ScopedFd> out;
    out.emplace_back(::dup(a2->fd()));
    out.emplace_back(::dup(c2->fd()));
    return out;
  };
  auto wrong = (*m)->Reattach(fds_of(), {sizes[0], sizes[1] + 4096});
  EXPECT_EQ(wrong.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(wrong.message().find("segment 1"), absl::string_view::npos) << wrong;
  EXPECT_FALSE((*m)->attached());
  ASSERT_TRUE((*m)->Reattach(fds_of(), sizes).ok());
  EXPECT_TRUE((*m)->attached());
  EXPECT_EQ((*m)->base(0), base0);
  const auto* p = reinterpret_cast<const uint8_t*>(base0);
  for (size_t i = 0; i < (3u << 20); i += 4099) ASSERT_EQ(p[i], static_cast<uint8_t>(i));
  EXPECT_NE(MapsLineOf(base1).find("memfd"), std::string::npos) << MapsLineOf(base1);
  EXPECT_FALSE(ReadFaults(base1));
}

TEST(HostMapping, AWritableMappingNeverDetaches) {
  auto b = MakeHostBackend();
  auto seg = b->Allocate("", 4096, "w");
  ASSERT_TRUE(seg.ok());
  std::vector<ScopedFd> fds;
  fds.emplace_back(::dup((*seg)->fd()));
  auto m = MapWritable(BackendKind::kHost, std::move(fds), {(*seg)->size()}, "");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ((*m)->Detach().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE((*m)->attached());
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
