// The peer-fill transport on this machine, over TCP (UCX_TLS=tcp): every byte pulled; only
// exposed bytes served (a wrong token, a range past the end, an unexposed region refused; a
// forged RMA get never answered); a serving process SIGKILLed or stopped mid-pull ends the
// pull with an error at once or at its deadline, never a hang; a puller killed mid-pull costs
// the server nothing; bad input named.
#include "pkg/peer/ucx_transfer.h"

#include <signal.h>
#include <sys/wait.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
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

// Pulls all of `region` from `server` into `dst`.
absl::Status PullWhole(UcxPuller& puller, const UcxServer& server, const ExposedRegion& region,
                       void* dst, const PullOptions& o) {
  return puller.Pull(server.worker_address(), region.token, 0, dst, region.length, o);
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
  ASSERT_TRUE(PullWhole(**puller, **server, *region, dst.data(), o).ok());
  EXPECT_EQ(dst, src);
  // A part: 5 MiB + 8 bytes from offset 3 MiB - 8, not a multiple of the chunk.
  const uint64_t off = (3ull << 20) - 8, len = (5ull << 20) + 8;
  std::vector<uint64_t> part(len / 8, 0);
  ASSERT_TRUE(
      (*puller)->Pull((*server)->worker_address(), region->token, off, part.data(), len, o).ok());
  EXPECT_TRUE(std::equal(part.begin(), part.end(), src.begin() + off / 8));
  EXPECT_TRUE((*server)->Unexpose(region->id).ok());
  EXPECT_EQ((*server)->Unexpose(region->id).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ((*server)->exposed(), 0u);
}

// A region served through a reader (how GPU memory is served: a device-to-host copy per
// request): the reader is asked for exactly the requested ranges, and a reader that fails
// ends the pull with UNAVAILABLE naming the bytes, not with wrong bytes.
TEST_F(UcxTransferTest, ARegionServedThroughAReaderIsPulledByteExactAndItsFailureIsNamed) {
  const std::vector<uint64_t> src = Pattern(6ull << 20);
  // Declared before the server: its thread may still be answering the failed pull's last
  // requests through the reader while the test ends, so what the reader reads must outlive
  // the server (ASan: stack-use-after-scope in a CI run when they were declared after it).
  std::atomic<uint64_t> asked{0};
  std::atomic<bool> fail{false};
  auto server = UcxServer::Start();
  ASSERT_TRUE(server.ok()) << server.status();
  auto region = (*server)->Expose(
      src.size() * 8, [&](uint64_t offset, void* dst, uint64_t n) -> absl::Status {
        if (fail.load()) return absl::InternalError("device gone");
        asked.fetch_add(n);
        std::memcpy(dst, reinterpret_cast<const std::byte*>(src.data()) + offset, n);
        return absl::OkStatus();
      });
  ASSERT_TRUE(region.ok()) << region.status();
  auto puller = UcxPuller::Create();
  ASSERT_TRUE(puller.ok()) << puller.status();
  PullOptions o;
  o.chunk_bytes = 1ull << 20;
  std::vector<uint64_t> dst(src.size(), 0);
  ASSERT_TRUE(PullWhole(**puller, **server, *region, dst.data(), o).ok());
  EXPECT_EQ(dst, src);
  EXPECT_EQ(asked.load(), region->length);
  fail = true;
  const absl::Status s = PullWhole(**puller, **server, *region, dst.data(), o);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_NE(s.message().find("could not read bytes [0, 1048576)"), std::string::npos) << s;
  EXPECT_EQ((*server)->Expose(8, nullptr).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(UcxTransferTest, BadInputIsNamed) {
  auto puller = UcxPuller::Create();
  ASSERT_TRUE(puller.ok());
  char buf[8];
  auto s = (*puller)->Pull("", std::string(kTokenBytes, 't'), 0, buf, 8, PullOptions{});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "UCX pull: no worker address, or a token of 16 bytes (not 16)");
  EXPECT_EQ((*puller)->Pull("a", "short", 0, buf, 8, PullOptions{}).message(),
            "UCX pull: no worker address, or a token of 5 bytes (not 16)");
  PullOptions zero;
  zero.inflight = 0;
  const std::string token(kTokenBytes, 't');
  EXPECT_EQ((*puller)->Pull("a", token, 0, buf, 8, zero).message(),
            "UCX pull: chunk_bytes must be in 1..16777216 and inflight positive");
  PullOptions huge;
  huge.chunk_bytes = kMaxChunkBytes + 1;
  EXPECT_EQ((*puller)->Pull("a", token, 0, buf, 8, huge).code(),
            absl::StatusCode::kInvalidArgument);
  auto server = UcxServer::Start();
  ASSERT_TRUE(server.ok());
  EXPECT_EQ((*server)->Expose(nullptr, 8).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(UcxTransferTest, OnlyExposedBytesAreServed) {
  const std::vector<uint64_t> src = Pattern(1ull << 20);
  auto server = UcxServer::Start();
  ASSERT_TRUE(server.ok()) << server.status();
  auto region = (*server)->Expose(src.data(), src.size() * 8);
  ASSERT_TRUE(region.ok());
  auto other = (*server)->Expose(src.data(), 4096);
  ASSERT_TRUE(other.ok());
  EXPECT_NE(region->token, other->token);
  auto puller = UcxPuller::Create();
  ASSERT_TRUE(puller.ok());
  const std::string& at = (*server)->worker_address();
  PullOptions o;
  o.timeout = std::chrono::seconds(20);
  std::vector<char> dst(2 << 20);
  std::string wrong = region->token;
  wrong[0] = static_cast<char>(wrong[0] ^ 1);
  auto s = (*puller)->Pull(at, wrong, 0, dst.data(), 4096, o);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_EQ(s.message(),
            "UCX pull: the server exposes no region with that token (unexposed, or never)");
  // Past the end, by one byte, and far (an offset that would wrap around).
  s = (*puller)->Pull(at, other->token, 1, dst.data(), 4096, o);
  EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange) << s;
  EXPECT_EQ(s.message(), "UCX pull: bytes [1, 4097) are outside the region");
  EXPECT_EQ((*puller)->Pull(at, region->token, ~uint64_t{0} - 100, dst.data(), 4096, o).code(),
            absl::StatusCode::kOutOfRange);
  // A good pull still works on the same puller, then not once unexposed.
  ASSERT_TRUE((*puller)->Pull(at, other->token, 0, dst.data(), 4096, o).ok());
  EXPECT_EQ(std::memcmp(dst.data(), src.data(), 4096), 0);
  ASSERT_TRUE((*server)->Unexpose(other->id).ok());
  EXPECT_EQ((*puller)->Pull(at, other->token, 0, dst.data(), 4096, o).code(),
            absl::StatusCode::kNotFound);
  EXPECT_TRUE((*puller)->Pull(at, region->token, 0, dst.data(), 8, o).ok());
}

// Over TCP, UCX confines no RMA get to registered memory: a worker with RMA on answers a get
// of any address, with a key the asker packed from its own memory (docs/peer-fill.md). The
// serving worker has active messages only, so such a get is never answered.
char secret_bytes[64] = "this process's private key";

TEST_F(UcxTransferTest, AForgedGetIsNeverAnswered) {
  auto server = UcxServer::Start();
  ASSERT_TRUE(server.ok());
  ucp_config_t* config = nullptr;
  ASSERT_EQ(ucp_config_read(nullptr, nullptr, &config), UCS_OK);
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_RMA;
  ucp_context_h ctx = nullptr;
  ASSERT_EQ(ucp_init(&params, config, &ctx), UCS_OK);
  ucp_config_release(config);
  ucp_worker_params_t wp{};
  ucp_worker_h worker = nullptr;
  ASSERT_EQ(ucp_worker_create(ctx, &wp, &worker), UCS_OK);
  ucp_ep_params_t ep_params{};
  ep_params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
  ep_params.address = reinterpret_cast<const ucp_address_t*>((*server)->worker_address().data());
  ep_params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  ucp_ep_h ep = nullptr;
  ASSERT_EQ(ucp_ep_create(worker, &ep_params, &ep), UCS_OK);
  // A key of the attacker's own memory.
  static char mine[4096];
  ucp_mem_map_params_t mp{};
  mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
  mp.address = mine;
  mp.length = sizeof mine;
  ucp_mem_h memh = nullptr;
  ASSERT_EQ(ucp_mem_map(ctx, &mp, &memh), UCS_OK);
  void* packed = nullptr;
  size_t packed_len = 0;
  ASSERT_EQ(ucp_rkey_pack(ctx, memh, &packed, &packed_len), UCS_OK);
  ucp_rkey_h rkey = nullptr;
  ASSERT_EQ(ucp_ep_rkey_unpack(ep, packed, &rkey), UCS_OK);
  ucp_rkey_buffer_release(packed);
  char got[64] = {};
  ucp_request_param_t rp{};
  const ucs_status_ptr_t r =
      ucp_get_nbx(ep, got, 32, reinterpret_cast<uint64_t>(secret_bytes), rkey, &rp);
  ucs_status_t status = UCS_PTR_IS_ERR(r) ? UCS_PTR_STATUS(r) : UCS_OK;
  if (r != nullptr && !UCS_PTR_IS_ERR(r)) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    while ((status = ucp_request_check_status(r)) == UCS_INPROGRESS &&
           std::chrono::steady_clock::now() < until) {
      ucp_worker_progress(worker);
    }
  }
  EXPECT_NE(status, UCS_OK) << "a get of an unexposed address completed";
  EXPECT_EQ(std::string(got), "");
  // Closing by force completes the get (with an error); bounded, in case it does not.
  ucp_request_param_t cp{};
  cp.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  cp.flags = UCP_EP_CLOSE_FLAG_FORCE;
  const ucs_status_ptr_t c = ucp_ep_close_nbx(ep, &cp);
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  auto pending = [](ucs_status_ptr_t q) {
    return q != nullptr && !UCS_PTR_IS_ERR(q) && ucp_request_check_status(q) == UCS_INPROGRESS;
  };
  while ((pending(r) || pending(c)) && std::chrono::steady_clock::now() < until) {
    ucp_worker_progress(worker);
  }
  ASSERT_FALSE(pending(r) || pending(c)) << "the forced close did not end the get";
  if (r != nullptr && !UCS_PTR_IS_ERR(r)) ucp_request_free(r);
  if (c != nullptr && !UCS_PTR_IS_ERR(c)) ucp_request_free(c);
  ucp_rkey_destroy(rkey);
  (void)ucp_mem_unmap(ctx, memh);
  ucp_worker_destroy(worker);
  ucp_cleanup(ctx);
}

// A serving process of its own, forked before this process starts UCX: it exposes `bytes`
// of the pattern and writes {address length, address, token} to the pipe, then serves until
// killed.
struct Child {
  pid_t pid = -1;
  std::string address, token;
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
    const uint64_t al = a.size();
    std::string msg;
    msg.append(reinterpret_cast<const char*>(&al), 8).append(a).append(r->token);
    if (::write(fds[1], msg.data(), msg.size()) != static_cast<ssize_t>(msg.size())) ::_exit(5);
    while (true) ::pause();
  }
  ::close(fds[1]);
  Child c;
  c.pid = pid;
  uint64_t al = 0;
  if (ReadAll(fds[0], &al, 8)) {
    c.address.resize(al);
    c.token.resize(kTokenBytes);
    if (!ReadAll(fds[0], c.address.data(), al) || !ReadAll(fds[0], c.token.data(), kTokenBytes)) {
      c.address.clear();
    }
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
    return puller_->Pull(child_.address, child_.token, 0, dst_.data(), kChildBytes, options_);
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
  EXPECT_NE(s.message().find("UCX pull: "), std::string::npos) << s;
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

// A puller of its own, forked before this process starts UCX: reads {address length,
// address, token} from the pipe, then pulls the region again and again until killed.
pid_t PullInChild(int* to_child, uint64_t bytes) {
  int fds[2];
  if (::pipe(fds) != 0) return -1;
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[1]);
    uint64_t al = 0;
    if (!ReadAll(fds[0], &al, 8)) ::_exit(3);
    std::string address(al, '\0'), token(kTokenBytes, '\0');
    if (!ReadAll(fds[0], address.data(), al) || !ReadAll(fds[0], token.data(), kTokenBytes)) {
      ::_exit(4);
    }
    auto puller = UcxPuller::Create();
    if (!puller.ok()) ::_exit(5);
    std::vector<char> dst(bytes);
    while (true) (void)(*puller)->Pull(address, token, 0, dst.data(), bytes, PullOptions{});
  }
  ::close(fds[0]);
  *to_child = fds[1];
  return pid;
}

TEST_F(UcxTransferTest, APullerKilledMidPullCostsTheServerNothing) {
  constexpr uint64_t kBytes = 64ull << 20;
  int to_child = -1;
  const pid_t child = PullInChild(&to_child, kBytes);
  ASSERT_GT(child, 0);
  const std::vector<uint64_t> src = Pattern(kBytes);
  auto server = UcxServer::Start();
  ASSERT_TRUE(server.ok());
  auto region = (*server)->Expose(src.data(), kBytes);
  ASSERT_TRUE(region.ok());
  const std::string& a = (*server)->worker_address();
  const uint64_t al = a.size();
  std::string msg;
  msg.append(reinterpret_cast<const char*>(&al), 8).append(a).append(region->token);
  ASSERT_EQ(::write(to_child, msg.data(), msg.size()), static_cast<ssize_t>(msg.size()));
  ::close(to_child);
  // Let it pull for a while (64 MiB takes tens of milliseconds or more), then kill it.
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  Reap(child);
  // The server still serves, byte-exact.
  auto puller = UcxPuller::Create();
  ASSERT_TRUE(puller.ok());
  std::vector<uint64_t> dst(src.size(), 0);
  PullOptions o;
  o.timeout = std::chrono::seconds(60);
  const absl::Status s = (*puller)->Pull(a, region->token, 0, dst.data(), kBytes, o);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(dst, src);
}

}  // namespace
}  // namespace weightcache::peer
