#include "pkg/net/acceptor.h"

#include <gtest/gtest.h>
#include <poll.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <deque>
#include <filesystem>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "pkg/net/testing/descriptor_shortage.h"
#include "pkg/util/mutex.h"
#include "pkg/util/unix_socket.h"

namespace weightcache::net {
namespace {

using namespace std::chrono_literals;

// Reads what the acceptor told a refused client before closing: its whole text until EOF.
std::string ReadToEof(int fd) {
  std::string out;
  char buf[256];
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 10000) <= 0) return out + "<no EOF>";
    const ssize_t r = ::read(fd, buf, sizeof buf);
    if (r <= 0) return out;
    out.append(buf, static_cast<size_t>(r));
  }
}

class AcceptorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/wc-acceptor-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    acceptor_.reset();
    std::filesystem::remove_all(dir_);
  }

  // Starts an acceptor whose connections are keyed by the tag of their socket.
  void Start(ListenerOptions o, const std::vector<std::string>& tags) {
    o.name = "test";
    o.identify = [this](int, const std::string& tag) -> absl::StatusOr<Identity> {
      if (tag == refused_tag_) return absl::PermissionDeniedError("tag " + tag + " is refused");
      return Identity{"tag:" + tag, "socket " + tag, {}};
    };
    o.serve = [this](Accepted a) {
      MutexLock l(mu_);
      served_.push_back(std::move(a));
      cv_.NotifyAll();
      return true;
    };
    o.tell_refused = [](int fd, const std::string& reason, const std::string& message) {
      (void)WriteAll(fd, reason + ": " + message);
    };
    auto a = Acceptor::Start(std::move(o));
    ASSERT_TRUE(a.ok()) << a.status();
    acceptor_ = std::move(a).value();
    for (const auto& t : tags) {
      auto fd = ListenUnix(Path(t), 0600);
      ASSERT_TRUE(fd.ok()) << fd.status();
      ASSERT_TRUE(acceptor_->Listen(std::move(fd).value(), t).ok());
    }
  }
  std::string Path(const std::string& tag) const { return dir_ + "/" + tag + ".sock"; }
  ScopedFd Connect(const std::string& tag) {
    auto fd = ConnectUnix(Path(tag));
    EXPECT_TRUE(fd.ok()) << fd.status();
    return fd.ok() ? std::move(fd).value() : ScopedFd();
  }
  // Waits until `n` connections were served (10 s at most: a failing test, not a bound).
  size_t WaitServed(size_t n) {
    MutexLock l(mu_);
    const auto until = std::chrono::steady_clock::now() + 10s;
    while (served_.size() < n && cv_.WaitUntil(mu_, until)) {
    }
    return served_.size();
  }
  template <typename Pred>
  Acceptor::Counters CountersOnce(Pred pred) {
    const auto until = std::chrono::steady_clock::now() + 10s;
    auto c = acceptor_->counters();
    while (!pred(c) && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(5ms);
      c = acceptor_->counters();
    }
    return c;
  }

  std::string dir_;
  std::string refused_tag_;
  std::unique_ptr<Acceptor> acceptor_;
  Mutex mu_;
  CondVar cv_;
  std::deque<Accepted> served_ ABSL_GUARDED_BY(mu_);
};

TEST_F(AcceptorTest, AcceptorCapsEachKeyAndTheTotalAndTellsTheRefusedWhy) {
  ListenerOptions o;
  o.limits = {.total = 3, .per_key = 2, .over_cap = 0};
  Start(std::move(o), {"a", "b"});
  ScopedFd a1 = Connect("a"), a2 = Connect("a");
  ASSERT_EQ(WaitServed(2), 2u);
  ScopedFd a3 = Connect("a");
  EXPECT_EQ(ReadToEof(a3.get()), "per_key: socket a holds 2 test connections, its cap (2)");
  ScopedFd b1 = Connect("b");
  ASSERT_EQ(WaitServed(3), 3u);
  ScopedFd b2 = Connect("b");
  EXPECT_EQ(ReadToEof(b2.get()), "total: test holds 3 connections, its cap in all");
  auto c = acceptor_->counters();
  EXPECT_EQ(c.accepted, 3u);
  EXPECT_EQ(c.refused["per_key"], 1u);
  EXPECT_EQ(c.refused["total"], 1u);
  EXPECT_EQ(c.open, 3u);
  // A connection the listener lets go gives its place back: key a is served again.
  {
    MutexLock l(mu_);
    served_.pop_front();
  }
  ScopedFd a4 = Connect("a");
  EXPECT_EQ(WaitServed(3), 3u);
  // (Counted just after `serve` returns: awaited, not read at once.)
  EXPECT_EQ(CountersOnce([](auto c) { return c.accepted == 4; }).accepted, 4u);
}

TEST_F(AcceptorTest, AcceptorHandsOverPastTheCapInTheBandMarked) {
  ListenerOptions o;
  o.limits = {.total = 10, .per_key = 1, .over_cap = 1};
  Start(std::move(o), {"a"});
  ScopedFd a1 = Connect("a"), a2 = Connect("a");
  ASSERT_EQ(WaitServed(2), 2u);
  ScopedFd a3 = Connect("a");
  EXPECT_NE(ReadToEof(a3.get()).find("per_key"), std::string::npos);
  MutexLock l(mu_);
  EXPECT_FALSE(served_[0].over_cap);
  EXPECT_TRUE(served_[1].over_cap);
  EXPECT_EQ(served_[1].who.key, "tag:a");
  EXPECT_EQ(served_[1].tag, "a");
}

TEST_F(AcceptorTest, AcceptorRefusesWhomTheListenerDoesNotKnow) {
  refused_tag_ = "x";
  Start({}, {"a", "x"});
  ScopedFd x = Connect("x");
  EXPECT_EQ(ReadToEof(x.get()), "identity: tag x is refused");
  EXPECT_EQ(acceptor_->counters().refused["identity"], 1u);
  EXPECT_EQ(acceptor_->counters().open, 0u);
}

TEST_F(AcceptorTest, AcceptorClosesSilentClientsAtTheFirstByteDeadlineAndServesTalkingOnes) {
  ListenerOptions o;
  o.first_byte = 200ms;
  Start(std::move(o), {"a"});
  ScopedFd silent = Connect("a");
  ScopedFd talking = Connect("a");
  auto c = CountersOnce([](auto c) { return c.waiting == 2; });
  EXPECT_EQ(c.waiting, 2u);
  ASSERT_TRUE(WriteAll(talking.get(), "hi").ok());
  ASSERT_EQ(WaitServed(1), 1u);
  {
    MutexLock l(mu_);
    char buf[2];
    EXPECT_EQ(::read(served_[0].fd.get(), buf, 2), 2);  // the byte is the listener's to read
  }
  EXPECT_EQ(ReadToEof(silent.get()).rfind("first_byte: socket a sent nothing within 200 ms", 0),
            0u);
  c = acceptor_->counters();
  EXPECT_EQ(c.refused["first_byte"], 1u);
  EXPECT_EQ(c.waiting, 0u);
  EXPECT_EQ(c.open, 1u);  // the silent one's place is given back
}

TEST_F(AcceptorTest, AcceptorOutOfDescriptorsBacksOffAndAcceptsOnceTheyAreBack) {
  Start({}, {"a"});
  std::vector<ScopedFd> clients;
  for (int i = 0; i < 3; ++i) {
    clients.emplace_back(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  }
  testing::DescriptorShortage shortage(256);
  ASSERT_TRUE(shortage.ok());
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  const std::string p = Path("a");
  std::copy(p.begin(), p.end(), addr.sun_path);
  for (auto& c : clients) {
    ASSERT_EQ(::connect(c.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  }
  auto c = CountersOnce([](auto c) { return c.refused["descriptors"] >= 1; });
  EXPECT_GE(c.refused["descriptors"], 1u);  // backed off: waits for descriptors, not spinning
  EXPECT_LE(c.refused["descriptors"], 100u);
  EXPECT_FALSE(acceptor_->healthy());
  EXPECT_EQ(c.accepted, 0u);
  shortage.Release();
  EXPECT_EQ(WaitServed(3), 3u);
  EXPECT_TRUE(acceptor_->healthy());
}

TEST_F(AcceptorTest, AcceptorUnlistenStopsOneSocketAndKeepsItsConnections) {
  Start({}, {"a", "b"});
  ScopedFd a = Connect("a");
  ASSERT_EQ(WaitServed(1), 1u);
  acceptor_->Unlisten("a");
  // Closed: a new client's connect is refused (the socket file stays; nobody listens).
  auto until = std::chrono::steady_clock::now() + 10s;
  while (ConnectUnix(Path("a")).ok() && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(5ms);
  }
  EXPECT_FALSE(ConnectUnix(Path("a")).ok());
  // The probes above may have been accepted before the socket closed: each is served.
  size_t before = 0;
  {
    MutexLock l(mu_);
    before = served_.size();
  }
  ScopedFd b = Connect("b");
  EXPECT_EQ(WaitServed(before + 1), before + 1);
  EXPECT_EQ(acceptor_->counters().open, before + 1);
}

// At the cap in all, a listener that asks for it has the oldest connection that is not
// established closed for a newcomer: first one still waiting for its first byte, then one
// the listener names (here: run inline, on the test's thread, which owns what it served).
TEST_F(AcceptorTest, AcceptorMakesRoomForANewcomerFromTheOldestNotYetEstablished) {
  ListenerOptions o;
  o.name = "inline";
  o.limits = {.total = 2, .per_key = 10, .over_cap = 0};
  o.first_byte = 10s;
  o.own_thread = false;
  std::deque<Accepted> mine;  // the listener's: served, none established
  o.identify = [](int, const std::string&) -> absl::StatusOr<Identity> {
    return Identity{"k", "client", {}};
  };
  o.serve = [&mine](Accepted a) {
    mine.push_back(std::move(a));
    return true;
  };
  o.make_room = [&mine] {
    if (mine.empty()) return false;
    mine.pop_front();  // closes it and gives its place back
    return true;
  };
  auto started = Acceptor::Start(std::move(o));
  ASSERT_TRUE(started.ok());
  std::unique_ptr<Acceptor> a = std::move(started).value();
  auto fd = ListenUnix(Path("a"), 0600);
  ASSERT_TRUE(fd.ok());
  ASSERT_TRUE(a->Listen(std::move(fd).value(), "a").ok());
  // Runs the acceptor until `done` (10 s at most: a failing test, not a bound).
  auto run_until = [&a](const std::function<bool()>& done) {
    const auto until = std::chrono::steady_clock::now() + 10s;
    while (!done() && std::chrono::steady_clock::now() < until) {
      pollfd p{a->fd(), POLLIN, 0};
      (void)::poll(&p, 1, std::min(a->TimeoutMs() < 0 ? 50 : a->TimeoutMs(), 50));
      a->Run();
    }
  };
  ScopedFd talker = Connect("a");
  ASSERT_TRUE(WriteAll(talker.get(), "x").ok());
  run_until([&] { return mine.size() == 1; });
  ASSERT_EQ(mine.size(), 1u);
  ScopedFd silent = Connect("a");
  run_until([&] { return a->counters().waiting == 1; });
  ScopedFd newcomer = Connect("a");  // the cap is reached: the silent one goes
  run_until([&] { return a->counters().refused["total"] == 1; });
  EXPECT_EQ(ReadToEof(silent.get()), "");  // closed
  auto c = a->counters();
  EXPECT_EQ(c.refused["total"], 1u);
  EXPECT_EQ(c.waiting, 1u);  // the newcomer waits for its first byte in its place
  ASSERT_TRUE(WriteAll(newcomer.get(), "y").ok());
  run_until([&] { return mine.size() == 2; });
  ASSERT_EQ(mine.size(), 2u);
  // Nothing waits now: the listener's oldest (the talker) is closed for the next one.
  ScopedFd third = Connect("a");
  run_until([&] { return a->counters().refused["total"] == 2; });
  EXPECT_EQ(a->counters().refused["total"], 2u);
  EXPECT_EQ(a->counters().waiting, 1u);
  EXPECT_EQ(mine.size(), 1u);
  a->Stop();
}

// True when `fd` (the client's end) reads as ended within `wait`: the acceptor shut it down.
bool EndsWithin(int fd, std::chrono::milliseconds wait) {
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, static_cast<int>(wait.count())) <= 0) return false;
  char c;
  return ::read(fd, &c, 1) == 0;
}

TEST_F(AcceptorTest, AcceptorEndsIdleConnectionsAndKeepsBusyAndTalkingOnes) {
  ListenerOptions o;
  o.idle = 200ms;
  Start(std::move(o), {"a"});
  ScopedFd quiet = Connect("a"), busy = Connect("a"), talking = Connect("a");
  ASSERT_EQ(WaitServed(3), 3u);
  {
    MutexLock l(mu_);
    ASSERT_NE(served_[0].activity.get(), nullptr);
    served_[1].activity.SetBusy(true);
  }
  // The listener touches `talking` as its bytes move, every 50 ms for 600 ms.
  for (int i = 0; i < 12; ++i) {
    {
      MutexLock l(mu_);
      served_[2].activity.Touch();
    }
    std::this_thread::sleep_for(50ms);
  }
  EXPECT_TRUE(EndsWithin(quiet.get(), 0ms));
  EXPECT_FALSE(EndsWithin(busy.get(), 0ms));
  EXPECT_FALSE(EndsWithin(talking.get(), 0ms));
  EXPECT_EQ(acceptor_->counters().refused["idle"], 1u);
  {
    // The listener still owns the descriptor the acceptor shut down: its reader sees the end.
    MutexLock l(mu_);
    char c;
    EXPECT_EQ(::read(served_[0].fd.get(), &c, 1), 0);
    served_.pop_back();  // the listener closes `talking`
  }
  // The work ends: the idle time starts then, and the connection ends after it.
  {
    MutexLock l(mu_);
    served_[1].activity.SetBusy(false);
  }
  EXPECT_FALSE(EndsWithin(busy.get(), 100ms));
  EXPECT_TRUE(EndsWithin(busy.get(), 5000ms));
  // The connection the listener closed is let be (never shut down by its number), and its
  // place given back.
  std::this_thread::sleep_for(400ms);
  EXPECT_EQ(acceptor_->counters().refused["idle"], 2u);
  EXPECT_EQ(CountersOnce([](auto c) { return c.open == 2; }).open, 2u);
}

TEST_F(AcceptorTest, AcceptorWithoutAnIdleTimeoutLeavesQuietConnections) {
  Start({}, {"a"});
  ScopedFd quiet = Connect("a");
  ASSERT_EQ(WaitServed(1), 1u);
  {
    MutexLock l(mu_);
    EXPECT_EQ(served_[0].activity.get(), nullptr);
  }
  EXPECT_FALSE(EndsWithin(quiet.get(), 300ms));
}

}  // namespace
}  // namespace weightcache::net
