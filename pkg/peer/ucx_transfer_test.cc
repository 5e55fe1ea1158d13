// The peer-fill transport on this machine, over TCP (UCX_TLS=tcp): every byte pulled; a serving
// process SIGKILLed or stopped mid-pull ends the pull with an error at once or at its deadline,
// never a hang; bad input named.
#include "pkg/peer/ucx_transfer.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace weightcache::peer {
namespace {

uint64_t Word(uint64_t i) { return i * 0x9E3779B97F4A7C15ull ^ (i >> 7); }

std::vector<uint64_t> Pattern(uint64_t bytes) {
  std::vector<uint64_t> v(bytes / 8);
  for (uint64_t i = 0; i < v.size(); ++i) v[i] = Word(i);
  return v;
}

class UcxTransferTest : public ::testing::Test {
 protected:
  void SetUp() override { ::setenv("UCX_TLS", "tcp", 1); }
};

TEST_F(UcxTransferTest, PullsEveryByteOfARegionAndOfAPartOfIt) {
  const std::vector<uint64_t> src = Pattern(24ull << 20);
  auto server = UcxServer::Start();
  ASSERT_TRUE(server.ok()) << server.status();
  auto region = (*server)->Expose(src.data(), src.size() * 8);
  ASSERT_TRUE(region.ok()) << region.status();
  EXPECT_EQ((*server)->exposed(), 1u);
  auto puller = UcxPuller::Create();
  ASSERT_TRUE(puller.ok()) << puller.status();
  PullOptions o;
  o.chunk_bytes = 1ull << 20;
  o.inflight = 3;
  std::vector<uint64_t> dst(src.size(), 0);
  ASSERT_TRUE((*puller)
                  ->Pull((*server)->worker_address(), region->rkey, region->address, dst.data(),
                         region->length, o)
                  .ok());
  EXPECT_EQ(dst, src);
  // A part: 5 MiB + 8 bytes from offset 3 MiB - 8, not a multiple of the chunk.
  const uint64_t off = (3ull << 20) - 8, len = (5ull << 20) + 8;
  std::vector<uint64_t> part(len / 8, 0);
  ASSERT_TRUE((*puller)
                  ->Pull((*server)->worker_address(), region->rkey, region->address + off,
                         part.data(), len, o)
                  .ok());
  EXPECT_TRUE(std::equal(part.begin(), part.end(), src.begin() + off / 8));
  EXPECT_TRUE((*server)->Unexpose(region->id).ok());
  EXPECT_EQ((*server)->Unexpose(region->id).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ((*server)->exposed(), 0u);
}

TEST_F(UcxTransferTest, BadInputIsNamed) {
  auto puller = UcxPuller::Create();
  ASSERT_TRUE(puller.ok());
  char buf[8];
  auto s = (*puller)->Pull("", "key", 0, buf, 8, PullOptions{});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "UCX pull: no worker address or remote key");
  PullOptions zero;
  zero.inflight = 0;
  EXPECT_EQ((*puller)->Pull("a", "k", 0, buf, 8, zero).code(), absl::StatusCode::kInvalidArgument);
  auto server = UcxServer::Start();
  ASSERT_TRUE(server.ok());
  EXPECT_EQ((*server)->Expose(nullptr, 8).status().code(), absl::StatusCode::kInvalidArgument);
}

// A serving process of its own, forked before this process starts UCX: it exposes `bytes`
// of the pattern and writes {address length, address, rkey length, rkey, region address} to
// the pipe, then serves until killed.
struct Child {
  pid_t pid = -1;
  std::string address, rkey;
  uint64_t region = 0;
};

bool ReadAll(int fd, void* p, size_t n) {
  auto* c = static_cast<char*>(p);
  while (n > 0) {
    const ssize_t r = ::read(fd, c, n);
    if (r <= 0) return false;
    c += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

Child ServeInChild(uint64_t bytes) {
  int fds[2];
  if (::pipe(fds) != 0) return {};
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    std::vector<uint64_t> src = Pattern(bytes);
    auto server = UcxServer::Start();
    if (!server.ok()) ::_exit(3);
    auto r = (*server)->Expose(src.data(), bytes);
    if (!r.ok()) ::_exit(4);
    const std::string& a = (*server)->worker_address();
    const uint64_t al = a.size(), rl = r->rkey.size();
    std::string msg;
    msg.append(reinterpret_cast<const char*>(&al), 8).append(a);
    msg.append(reinterpret_cast<const char*>(&rl), 8).append(r->rkey);
    msg.append(reinterpret_cast<const char*>(&r->address), 8);
    if (::write(fds[1], msg.data(), msg.size()) != static_cast<ssize_t>(msg.size())) ::_exit(5);
    while (true) ::pause();
  }
  ::close(fds[1]);
  Child c;
  c.pid = pid;
  uint64_t al = 0, rl = 0;
  if (ReadAll(fds[0], &al, 8)) {
    c.address.resize(al);
    ReadAll(fds[0], c.address.data(), al);
    ReadAll(fds[0], &rl, 8);
    c.rkey.resize(rl);
    ReadAll(fds[0], c.rkey.data(), rl);
    ReadAll(fds[0], &c.region, 8);
  }
  ::close(fds[0]);
  return c;
}

void Reap(pid_t pid) {
  ::kill(pid, SIGKILL);
  int st = 0;
  ::waitpid(pid, &st, 0);
}

// A serving child of kChildBytes, a puller, and options of 1 MiB chunks one at a time.
class UcxChildTest : public UcxTransferTest {
 protected:
  static constexpr uint64_t kChildBytes = 64ull << 20;
  void SetUp() override {
    UcxTransferTest::SetUp();
    child_ = ServeInChild(kChildBytes);
    ASSERT_GT(child_.pid, 0);
    ASSERT_FALSE(child_.address.empty());
    auto p = UcxPuller::Create();
    ASSERT_TRUE(p.ok()) << p.status();
    puller_ = std::move(p).value();
    dst_.assign(kChildBytes / 8, 0);
    options_.chunk_bytes = 1ull << 20;
    options_.inflight = 1;
  }
  void TearDown() override {
    if (child_.pid > 0) Reap(child_.pid);
  }
  absl::Status Pull() {
    return puller_->Pull(child_.address, child_.rkey, child_.region, dst_.data(), kChildBytes,
                         options_);
  }
  Child child_;
  std::unique_ptr<UcxPuller> puller_;
  std::vector<uint64_t> dst_;
  PullOptions options_;
};

TEST_F(UcxChildTest, AServerKilledMidPullFailsThePullAtOnce) {
  options_.timeout = std::chrono::seconds(60);  // far away: the error must come from the death
  uint64_t at_kill = 0;
  options_.after_chunk = [&](uint64_t done) {
    if (at_kill == 0 && done >= (4ull << 20)) {
      at_kill = done;
      ::kill(child_.pid, SIGKILL);
    }
  };
  const auto t0 = std::chrono::steady_clock::now();
  const absl::Status s = Pull();
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_GT(at_kill, 0u);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_NE(s.message().find("UCX "), std::string::npos) << s;
  // What bounds it: UCX noticing the closed TCP connection, not the 60 s deadline.
  EXPECT_LT(took, 30.0) << s;
  // The bytes before the kill arrived intact.
  const std::vector<uint64_t> src = Pattern(4ull << 20);
  EXPECT_TRUE(std::equal(src.begin(), src.end(), dst_.begin()));
}

TEST_F(UcxChildTest, AServerThatStopsAnsweringEndsThePullAtItsDeadline) {
  options_.timeout = std::chrono::seconds(3);
  bool stopped = false;
  options_.after_chunk = [&](uint64_t done) {
    if (!stopped && done >= (2ull << 20)) {
      stopped = true;
      ::kill(child_.pid, SIGSTOP);  // alive, connection open, answers nothing
    }
  };
  const absl::Status s = Pull();
  EXPECT_TRUE(stopped);
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_NE(s.message().find("of 67108864 bytes after 3000 ms"), std::string::npos) << s;
}

}  // namespace
}  // namespace weightcache::peer
