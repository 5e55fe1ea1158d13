// The keeper in process with real memfds over its real socket: deposits of many descriptors
// (several SCM_RIGHTS batches) and large bodies (several datagrams) come back intact from
// Adopt; drop, replace, the descriptor limit and the uid check answer with named errors.
#include <grp.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "pkg/keeper/client.h"
#include "pkg/keeper/server.h"
#include "pkg/keeper/wire.h"
#include "pkg/util/unix_socket.h"
#include "tests/testutil/temp_dir.h"

namespace weightcache::keeper {
namespace {

using testing::TempDir;

// A memfd holding `text`.
ScopedFd Memfd(const std::string& text) {
  ScopedFd fd(::memfd_create("keeper-test", MFD_CLOEXEC));
  EXPECT_TRUE(fd.valid());
  EXPECT_EQ(::write(fd.get(), text.data(), text.size()), static_cast<ssize_t>(text.size()));
  return fd;
}

std::string Contents(int fd) {
  char buf[64] = {};
  const ssize_t n = ::pread(fd, buf, sizeof buf, 0);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : "";
}

class KeeperTest : public ::testing::Test {
 protected:
  std::unique_ptr<Keeper> Start(uint64_t max_fds = 4096, std::vector<uid_t> uids = {}) {
    KeeperOptions o;
    o.socket_path = dir_ / "k/keeper.sock";
    o.max_fds = max_fds;
    o.allowed_uids = std::move(uids);
    auto k = Keeper::Start(o);
    EXPECT_TRUE(k.ok()) << k.status();
    return k.ok() ? std::move(k).value() : nullptr;
  }
  std::unique_ptr<KeeperClient> Connect() {
    auto c = KeeperClient::Connect(dir_ / "k/keeper.sock");
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? std::move(c).value() : nullptr;
  }
  TempDir dir_;
};

TEST_F(KeeperTest, DepositThenAdoptReturnsEveryDescriptorAndTheBody) {
  auto k = Start();
  auto c = Connect();
  // 300 descriptors: five batches of at most kMaxFdsPerMessage; a 200 KiB body: 4 datagrams.
  std::vector<ScopedFd> owned;
  std::vector<int> raw;
  for (int i = 0; i < 300; ++i) {
    owned.push_back(Memfd("segment " + std::to_string(i)));
    raw.push_back(owned.back().get());
  }
  std::string body(200 << 10, 'x');
  for (size_t i = 0; i < body.size(); i += 997) body[i] = static_cast<char>('a' + i % 26);
  ASSERT_TRUE(c->Deposit("fp1@host", body, raw).ok());
  ASSERT_TRUE(c->Deposit("fp2@host", "small", {raw[0]}).ok());
  owned.clear();  // the keeper's copies are all that is left

  auto stats = c->Stats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(*stats, "entries=2 fds=301 max_fds=4096");

  c.reset();                 // the daemon goes (the keeper serves one at a time)
  auto adopter = Connect();  // a restarted daemon: a new connection
  auto all = adopter->Adopt();
  ASSERT_TRUE(all.ok()) << all.status();
  ASSERT_EQ(all->size(), 2u);
  EXPECT_EQ((*all)[0].key, "fp1@host");
  EXPECT_EQ((*all)[0].body, body);
  ASSERT_EQ((*all)[0].fds.size(), 300u);
  for (int i = 0; i < 300; ++i) {
    EXPECT_EQ(Contents((*all)[0].fds[i].get()), "segment " + std::to_string(i)) << i;
  }
  EXPECT_EQ((*all)[1].key, "fp2@host");
  EXPECT_EQ(Contents((*all)[1].fds[0].get()), "segment 0");
  // Adopting does not take them away from the keeper.
  EXPECT_EQ(*adopter->Stats(), "entries=2 fds=301 max_fds=4096");
}

TEST_F(KeeperTest, DropAndReplace) {
  auto k = Start();
  auto c = Connect();
  ScopedFd a = Memfd("old"), b = Memfd("new");
  ASSERT_TRUE(c->Deposit("fp@host", "v1", {a.get(), a.get()}).ok());
  ASSERT_TRUE(c->Deposit("fp@host", "v2", {b.get()}).ok());
  EXPECT_EQ(*c->Stats(), "entries=1 fds=1 max_fds=4096");
  auto all = c->Adopt();
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->size(), 1u);
  EXPECT_EQ((*all)[0].body, "v2");
  EXPECT_EQ(Contents((*all)[0].fds[0].get()), "new");

  EXPECT_TRUE(c->Drop("fp@host").ok());
  const absl::Status again = c->Drop("fp@host");
  EXPECT_EQ(again.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(again.message().find("no entry 'fp@host'"), std::string::npos) << again;
  EXPECT_EQ(*c->Stats(), "entries=0 fds=0 max_fds=4096");
}

TEST_F(KeeperTest, RefusesCleanlyAtItsDescriptorLimitAndKeepsServing) {
  auto k = Start(/*max_fds=*/10);
  auto c = Connect();
  ScopedFd f = Memfd("x");
  ASSERT_TRUE(c->Deposit("a@host", "a", std::vector<int>(8, f.get())).ok());
  const absl::Status over = c->Deposit("b@host", "b", std::vector<int>(5, f.get()));
  EXPECT_EQ(over.code(), absl::StatusCode::kResourceExhausted) << over;
  EXPECT_NE(over.message().find("deposit 'b@host': 5 descriptors would pass the keeper's limit "
                                "(holds 8 of 10"),
            std::string::npos)
      << over;
  // The same connection goes on: what fits is still kept.
  EXPECT_TRUE(c->Deposit("c@host", "c", std::vector<int>(2, f.get())).ok());
  EXPECT_EQ(*c->Stats(), "entries=2 fds=10 max_fds=10");
}

// Connections are capped (KeeperOptions::max_connections): one past the cap is told why at
// once, and a place that frees up is served again.
TEST_F(KeeperTest, RefusesAConnectionPastItsCapAndServesOnceOneCloses) {
  KeeperOptions o;
  o.socket_path = dir_ / "k/keeper.sock";
  o.max_fds = 4096;
  o.max_connections = 2;
  auto k = Keeper::Start(o);
  ASSERT_TRUE(k.ok()) << k.status();
  auto a = Connect();
  auto b = Connect();
  ASSERT_TRUE(a && b);
  auto over = KeeperClient::Connect(dir_ / "k/keeper.sock");
  ASSERT_FALSE(over.ok());
  EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted) << over.status();
  EXPECT_NE(over.status().message().find("keeper holds 2 connections, its cap in all"),
            std::string::npos)
      << over.status();
  EXPECT_EQ(*a->Stats(), "entries=0 fds=0 max_fds=4096");  // the admitted ones go on
  b.reset();
  // The keeper learns of the hang-up when its thread reads it: bounded retries.
  absl::StatusOr<std::unique_ptr<KeeperClient>> again = absl::UnavailableError("not tried");
  for (int i = 0; i < 200 && !again.ok(); ++i) {
    again = KeeperClient::Connect(dir_ / "k/keeper.sock");
    if (!again.ok()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(*(*again)->Stats(), "entries=0 fds=0 max_fds=4096");
}

TEST_F(KeeperTest, RefusesAPeerOfAnotherUid) {
  auto k = Start(4096, {::geteuid() + 1});
  auto s = KeeperClient::Connect(dir_ / "k/keeper.sock");
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kPermissionDenied) << s.status();
  EXPECT_NE(s.status().message().find("may not use the keeper"), std::string::npos) << s.status();
}

// The daemon's side of the same check: the client reads who serves the socket before it
// sends or believes anything, and refuses a keeper of another uid by name.
TEST_F(KeeperTest, KeeperImpostorOfAnotherUidIsRefusedByTheClient) {
  auto k = Start();
  const uid_t other = ::geteuid() == 0 ? 65534 : 0;
  auto s = KeeperClient::Connect(dir_ / "k/keeper.sock", std::chrono::seconds(5), other);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kPermissionDenied) << s.status();
  EXPECT_NE(s.status().message().find(
                "the keeper there runs as uid " + std::to_string(::geteuid()) + " (pid " +
                std::to_string(::getpid()) + "), not the expected uid " + std::to_string(other)),
            std::string::npos)
      << s.status();
  EXPECT_EQ(KeeperClient::ImpostorUid(s.status()), ::geteuid());
  EXPECT_EQ(KeeperClient::ImpostorUid(absl::PermissionDeniedError("x")), std::nullopt);
  // Its own uid (the default) is served.
  EXPECT_TRUE(KeeperClient::Connect(dir_ / "k/keeper.sock").ok());
}

// A daemon of another uid (here: a real process that dropped to uid 65534), even where the
// socket's mode lets it connect, is refused by the keeper by name: it neither adopts nor
// deposits.
TEST_F(KeeperTest, KeeperImpostorDaemonOfAnotherUidIsRefusedByTheKeeper) {
  if (::geteuid() != 0) GTEST_SKIP() << "drops to uid 65534: run as root";
  ASSERT_EQ(::chmod(dir_.path().c_str(), 0711), 0);
  ASSERT_EQ(::mkdir((dir_ / "k").c_str(), 0755), 0);
  auto k = Start();
  ASSERT_EQ(::chmod((dir_ / "k/keeper.sock").c_str(), 0666), 0);  // the mode is not the guard
  int out[2];
  ASSERT_EQ(::pipe(out), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(out[0]);
    std::string said = "setuid failed";
    if (::setgroups(0, nullptr) == 0 && ::setgid(65534) == 0 && ::setuid(65534) == 0) {
      auto c = KeeperClient::Connect(dir_ / "k/keeper.sock", std::chrono::seconds(5),
                                     /*keeper_uid=*/0);
      said = c.ok() ? "served" : std::string(c.status().ToString());
    }
    (void)!::write(out[1], said.data(), said.size());
    ::_exit(0);
  }
  ::close(out[1]);
  std::string said;
  char buf[512];
  for (ssize_t n; (n = ::read(out[0], buf, sizeof buf)) > 0;) said.append(buf, n);
  ::close(out[0]);
  int st = 0;
  ASSERT_EQ(::waitpid(child, &st, 0), child);
  EXPECT_NE(said.find("PERMISSION_DENIED"), std::string::npos) << said;
  EXPECT_NE(said.find("uid 65534 may not use the keeper (allowed: uid 0"), std::string::npos)
      << said;
  EXPECT_EQ(k->stats().entries, 0u);
}

// One daemon at a time: while the first connection that deposited is open, another may ask
// for stats but neither adopt, deposit nor drop (a second daemon, started for debugging with
// the default socket, would drop the first one's entries); once the first goes, it may.
TEST_F(KeeperTest, ServesOneDaemonAtATime) {
  auto k = Start();
  auto first = Connect();
  ScopedFd f = Memfd("x");
  ASSERT_TRUE(first->Deposit("a@host", "a", {f.get()}).ok());
  auto second = Connect();
  for (const absl::Status& s : {second->Adopt().status(), second->Drop("a@host"),
                                second->Deposit("b@host", "b", {f.get()})}) {
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    EXPECT_NE(s.message().find("it serves the daemon pid " + std::to_string(::getpid())),
              std::string::npos)
        << s;
  }
  EXPECT_EQ(*second->Stats(), "entries=1 fds=1 max_fds=4096");  // nothing was taken
  EXPECT_TRUE(first->Deposit("c@host", "c", {f.get()}).ok());   // the owner goes on
  first.reset();
  // The owner's hang-up may reach the keeper after the next request: it sees it is gone.
  auto all = second->Adopt();
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(all->size(), 2u);
}

// A keeper that stopped accepting (frozen: its backlog full) is refused at once, not waited
// for; one that accepted but never greets costs the client its timeout, no more.
TEST(KeeperClientTest, AFrozenKeeperCostsAtMostTheTimeout) {
  TempDir dir;
  const std::string path = dir / "keeper.sock";
  auto listener = ListenUnix(path, 0600, /*backlog=*/1, SOCK_SEQPACKET);
  ASSERT_TRUE(listener.ok()) << listener.status();
  std::vector<ScopedFd> queued;  // connections the "keeper" never accepts
  absl::Status full;
  for (int i = 0; i < 8 && full.ok(); ++i) {
    auto c = ConnectUnixNoWait(path, SOCK_SEQPACKET);
    if (c.ok()) {
      queued.push_back(std::move(c).value());
    } else {
      full = c.status();
    }
  }
  EXPECT_EQ(full.code(), absl::StatusCode::kUnavailable) << full;
  EXPECT_NE(full.message().find("backlog is full"), std::string::npos) << full;
  auto t0 = std::chrono::steady_clock::now();
  auto refused = KeeperClient::Connect(path, std::chrono::milliseconds(200));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable) << refused.status();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(200));
  queued.clear();  // room again: the connection is queued, the greeting never comes
  ScopedFd drain(::accept4(listener->get(), nullptr, nullptr, SOCK_CLOEXEC));  // one freed
  t0 = std::chrono::steady_clock::now();
  auto silent = KeeperClient::Connect(path, std::chrono::milliseconds(200));
  const auto waited = std::chrono::steady_clock::now() - t0;
  EXPECT_FALSE(silent.ok());
  EXPECT_GE(waited, std::chrono::milliseconds(200));
  EXPECT_LT(waited, std::chrono::seconds(5)) << "the timeout bounds the greeting";
}

TEST(KeeperWire, HeaderBoundsAreChecked) {
  EXPECT_FALSE(ParseHeader("short").ok());
  std::string h(kHeaderBytes, '\0');
  EXPECT_NE(ParseHeader(h).status().message().find("bad magic"), std::string::npos);
  h.replace(0, 4, "WCK1");
  h[4] = 99;  // op
  EXPECT_NE(ParseHeader(h).status().message().find("unknown op 99"), std::string::npos);
  h[4] = 1;
  h[15] = 0x7f;  // body length ~2 GiB
  EXPECT_NE(ParseHeader(h).status().message().find("body of"), std::string::npos);
  h[15] = 0;
  auto ok = ParseHeader(h);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->op, Op::kDeposit);
}

}  // namespace
}  // namespace weightcache::keeper
