// The peer API's TCP port (issue 47) on real sockets: loopback TCP from several source
// addresses (all of 127/8 is local), relayed to an echoing Unix server that stands in for
// gRPC. A "handshake" here is what the port can see of one: a client's handshake record, then
// a complete application-data record, then the server's application data (the echo).
#include "pkg/server/wire/peer_port.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "pkg/net/testing/descriptor_shortage.h"
#include "pkg/util/mutex.h"
#include "pkg/util/scoped_fd.h"
#include "pkg/util/unix_socket.h"
#include "tests/testutil/tcp.h"
#include "tests/testutil/temp_dir.h"

namespace weightcache::server {
namespace {

using namespace std::chrono_literals;
using weightcache::testing::ClosedWithin;
using weightcache::testing::ConnectFrom;
using weightcache::testing::TempDir;

// A record of each kind the scanner reads: a (fake) ClientHello, then application data.
const std::string kHello("\x16\x03\x01\x00\x04\x01\x00\x00\x00", 9);
const std::string kData(
    "\x17\x03\x03\x00\x03"
    "abc",
    8);

// Stands in for the gRPC server: accepts on a Unix socket, echoes every byte, and records
// each connection's peer name as gRPC spells it ("unix-abstract:<name>").
class EchoBackend {
 public:
  explicit EchoBackend(const std::string& path) {
    auto fd = ListenUnix(path, 0600, 1024);
    EXPECT_TRUE(fd.ok()) << fd.status();
    if (fd.ok()) listen_ = std::move(fd).value();
    (void)::fcntl(listen_.get(), F_SETFL, O_NONBLOCK);
    thread_ = std::thread([this] { Loop(); });
  }
  ~EchoBackend() {
    stop_ = true;
    thread_.join();
  }
  std::vector<std::string> peers() const {
    MutexLock l(mu_);
    return peers_;
  }
  size_t bytes() const {
    MutexLock l(mu_);
    return bytes_;
  }

 private:
  void Loop() {
    std::vector<ScopedFd> conns;
    while (!stop_) {
      std::vector<pollfd> p{{listen_.get(), POLLIN, 0}};
      for (const auto& c : conns) p.push_back({c.get(), POLLIN, 0});
      if (::poll(p.data(), p.size(), 20) <= 0) continue;
      if (p[0].revents & POLLIN) {
        ScopedFd c(::accept4(listen_.get(), nullptr, nullptr, SOCK_CLOEXEC));
        if (c) {
          sockaddr_un un{};
          socklen_t len = sizeof un;
          std::string name = "unix:";
          if (::getpeername(c.get(), reinterpret_cast<sockaddr*>(&un), &len) == 0 &&
              len > sizeof(sa_family_t) + 1 && un.sun_path[0] == '\0') {
            name = "unix-abstract:" + std::string(un.sun_path + 1, len - sizeof(sa_family_t) - 1);
          }
          MutexLock l(mu_);
          peers_.push_back(name);
          conns.push_back(std::move(c));
        }
      }
      for (size_t i = 1; i < p.size(); ++i) {
        if (p[i].revents == 0) continue;
        char buf[4096];
        const ssize_t r = ::recv(p[i].fd, buf, sizeof buf, MSG_DONTWAIT);
        if (r > 0) {
          (void)::send(p[i].fd, buf, static_cast<size_t>(r), MSG_NOSIGNAL);
          MutexLock l(mu_);
          bytes_ += static_cast<size_t>(r);
        } else if (r == 0 || (errno != EAGAIN && errno != EINTR)) {
          for (auto& c : conns) {
            if (c.get() == p[i].fd) c.reset();
          }
        }
      }
      conns.erase(std::remove_if(conns.begin(), conns.end(), [](const ScopedFd& c) { return !c; }),
                  conns.end());
    }
  }

  ScopedFd listen_;
  std::atomic<bool> stop_{false};
  mutable Mutex mu_;
  std::vector<std::string> peers_ ABSL_GUARDED_BY(mu_);
  size_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread thread_;
};

int LocalPort(int fd) {
  sockaddr_in a{};
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  return ntohs(a.sin_port);
}

// Sends `bytes` and reads them back from the echo; false when the connection closed or the
// echo did not come within 10 s.
bool RoundTrip(int fd, const std::string& bytes) {
  if (::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(bytes.size())) {
    return false;
  }
  std::string got;
  const auto until = std::chrono::steady_clock::now() + 10s;
  while (got.size() < bytes.size() && std::chrono::steady_clock::now() < until) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    char buf[4096];
    const ssize_t r = ::recv(fd, buf, sizeof buf, MSG_DONTWAIT);
    if (r == 0 || (r < 0 && errno != EAGAIN)) return false;
    if (r > 0) got.append(buf, static_cast<size_t>(r));
  }
  return got == bytes;
}

// What the port counts as a completed handshake: a handshake record, a complete
// application-data record, and the server's application data after it (the echo).
bool Handshake(int fd) { return RoundTrip(fd, kHello + kData); }

class PeerPortTest : public ::testing::Test {
 protected:
  // `stalled`: gRPC's socket never accepts (what gRPC 1.51's listener does after an EMFILE).
  void Start(size_t total = 1024, size_t per_address = 16,
             std::chrono::milliseconds handshake = 10s, bool stalled = false,
             std::chrono::milliseconds idle = PeerPort::Options{}.idle) {
    if (stalled) {
      auto fd = ListenUnix(dir_ / "grpc.sock", 0600, 1024);
      ASSERT_TRUE(fd.ok()) << fd.status();
      stalled_ = std::move(fd).value();
    } else {
      backend_ = std::make_unique<EchoBackend>(dir_ / "grpc.sock");
    }
    PeerPort::Options o;
    o.max_connections = total;
    o.max_connections_per_address = per_address;
    o.handshake_timeout = handshake;
    o.idle = idle;
    o.listen = "127.0.0.1:0";
    o.backend_path = dir_ / "grpc.sock";
    auto p = PeerPort::Start(std::move(o));
    ASSERT_TRUE(p.ok()) << p.status();
    port_ = std::move(p).value();
  }
  ScopedFd Connect(const std::string& from = "127.0.0.1") {
    ScopedFd fd = ConnectFrom(from, port_->port());
    EXPECT_TRUE(fd) << "connect from " << from << ": " << std::strerror(errno);
    return fd;
  }
  // The counters once `done` holds them (the port accepts on its own thread); bounded.
  PeerPort::Counters CountersOnce(const std::function<bool(const PeerPort::Counters&)>& done) {
    const auto until = std::chrono::steady_clock::now() + 20s;
    PeerPort::Counters c = port_->counters();
    while (!done(c) && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(5ms);
      c = port_->counters();
    }
    return c;
  }

  TempDir dir_;
  std::unique_ptr<EchoBackend> backend_;
  ScopedFd stalled_;
  std::unique_ptr<PeerPort> port_;
};

using weightcache::testing::DescriptorShortage;

TEST(TlsRecordScannerTest, ReadsRecordsInPiecesAndCountsApplicationData) {
  TlsRecordScanner s(/*first_must_be_handshake=*/true);
  const std::string bytes = kHello + kData + kData.substr(0, 6);
  for (char b : bytes) ASSERT_TRUE(s.Feed(&b, 1));  // one byte at a time
  EXPECT_EQ(s.records(), 3u);
  EXPECT_EQ(s.application_data_started(), 2u);
  EXPECT_EQ(s.application_data_completed(), 1u);  // the last one is missing 2 bytes
  ASSERT_TRUE(s.Feed("bc", 2));
  EXPECT_EQ(s.application_data_completed(), 2u);
}

TEST(TlsRecordScannerTest, BytesThatCannotBeTlsBreakIt) {
  {  // a client that starts with anything but a handshake record (HTTP, HTTP/2 in clear)
    TlsRecordScanner s(true);
    EXPECT_FALSE(s.Feed("GET / HTTP/1.1\r\n", 16));
    TlsRecordScanner h2(true);
    EXPECT_FALSE(h2.Feed("PRI * HTTP/2.0\r\n", 16));
    TlsRecordScanner data_first(true);
    EXPECT_FALSE(data_first.Feed(kData.data(), kData.size()));
  }
  {  // an unknown type, a version that is not 3.x, a length past 2^14 + 2048
    TlsRecordScanner a(false), b(false), c(false);
    EXPECT_FALSE(a.Feed("\x18\x03\x03\x00\x01", 5));  // heartbeat
    EXPECT_FALSE(b.Feed("\x16\x02\x00\x00\x01", 5));
    EXPECT_FALSE(c.Feed("\x17\x03\x03\x48\x01", 5));
    EXPECT_TRUE(c.broken());
    EXPECT_FALSE(c.Feed(kData.data(), kData.size()));  // for ever after
  }
  TlsRecordScanner largest(false);
  EXPECT_TRUE(largest.Feed("\x17\x03\x03\x48\x00", 5));
}

TEST_F(PeerPortTest, AnAddressPastItsCapIsClosedAtAcceptAndOthersStillGetIn) {
  Start(/*total=*/64, /*per_address=*/4);
  std::vector<ScopedFd> flood;
  for (int i = 0; i < 10; ++i) flood.push_back(Connect("127.0.0.2"));
  auto c = CountersOnce([](auto c) { return c.refused["per_key"] == 6; });
  EXPECT_EQ(c.refused["per_key"], 6u);
  EXPECT_EQ(c.open, 4u);
  int closed = 0;
  for (auto& fd : flood) closed += ClosedWithin(fd.get(), 50) ? 1 : 0;
  EXPECT_EQ(closed, 6);
  // Another address is not held to the first one's count.
  ScopedFd other = Connect("127.0.0.3");
  EXPECT_TRUE(Handshake(other.get()));
  EXPECT_EQ(port_->counters().open, 5u);
  // A connection that goes frees its address's slot.
  flood.clear();
  CountersOnce([](auto c) { return c.open == 1; });
  ScopedFd again = Connect("127.0.0.2");
  EXPECT_TRUE(Handshake(again.get()));
}

TEST_F(PeerPortTest, AtTheTotalCapTheOldestHandshakingConnectionMakesRoom) {
  Start(/*total=*/4, /*per_address=*/4);
  ScopedFd peer = Connect("127.0.0.10");  // a real peer, established
  ASSERT_TRUE(Handshake(peer.get()));
  std::vector<ScopedFd> idle;
  for (int i = 0; i < 3; ++i) idle.push_back(Connect("127.0.0.2"));
  CountersOnce([](auto c) { return c.open == 4; });
  // Full: a newcomer from anywhere closes the oldest connection still in its handshake.
  ScopedFd newcomer = Connect("127.0.0.3");
  EXPECT_TRUE(ClosedWithin(idle[0].get(), 5000));
  EXPECT_TRUE(Handshake(newcomer.get()));
  auto c = port_->counters();
  EXPECT_EQ(c.refused["total"], 1u);
  EXPECT_EQ(c.open, 4u);
  // Every connection established: a newcomer is closed, nobody else is.
  ASSERT_TRUE(Handshake(idle[1].get()));
  ASSERT_TRUE(Handshake(idle[2].get()));
  ScopedFd late = Connect("127.0.0.4");
  EXPECT_TRUE(ClosedWithin(late.get(), 5000));
  EXPECT_EQ(port_->counters().refused["total"], 2u);
  for (int fd : {peer.get(), idle[1].get(), idle[2].get(), newcomer.get()}) {
    EXPECT_TRUE(RoundTrip(fd, kData));
  }
}

TEST_F(PeerPortTest, AConnectionWithoutAHandshakeIsClosedAtTheDeadline) {
  Start(1024, 16, /*handshake=*/300ms);
  const auto start = std::chrono::steady_clock::now();
  ScopedFd silent = Connect();      // sends nothing
  ScopedFd hello_only = Connect();  // a ClientHello, then nothing
  ScopedFd partial = Connect();     // application data that never completes
  ScopedFd peer = Connect();        // completes it
  ASSERT_TRUE(RoundTrip(hello_only.get(), kHello));
  ASSERT_TRUE(RoundTrip(partial.get(), kHello + kData.substr(0, 6)));
  ASSERT_TRUE(Handshake(peer.get()));
  EXPECT_TRUE(ClosedWithin(silent.get(), 10000));
  EXPECT_GE(std::chrono::steady_clock::now() - start, 300ms);  // at the deadline, not before
  EXPECT_TRUE(ClosedWithin(hello_only.get(), 10000));
  EXPECT_TRUE(ClosedWithin(partial.get(), 10000));
  // The silent one at the door (it never reached the port), the others in their handshake.
  // (A connection's place is given back just after its refusal is counted: both awaited.)
  auto c = CountersOnce([](auto c) { return c.refused["handshake_deadline"] == 2 && c.open == 1; });
  EXPECT_EQ(c.refused["handshake_deadline"], 2u);
  EXPECT_EQ(c.refused["first_byte"], 1u);
  EXPECT_EQ(c.open, 1u);
  // The established one outlives the deadline.
  std::this_thread::sleep_for(600ms);
  EXPECT_TRUE(RoundTrip(peer.get(), kData));
  EXPECT_EQ(port_->counters().refused["handshake_deadline"], 2u);
}

// A peer's connection that moves no byte for the idle time is ended at the door (its channel
// connects again when it next asks); one that keeps talking is kept.
TEST_F(PeerPortTest, AQuietPeerConnectionIsEndedAfterTheIdleTimeAndATalkingOneKept) {
  Start(1024, 16, /*handshake=*/10s, /*stalled=*/false, /*idle=*/400ms);
  ScopedFd quiet = Connect();
  ScopedFd talking = Connect("127.0.0.2");
  ASSERT_TRUE(Handshake(quiet.get()));
  ASSERT_TRUE(Handshake(talking.get()));
  for (int i = 0; i < 12; ++i) {
    ASSERT_TRUE(RoundTrip(talking.get(), kData)) << "round " << i;
    std::this_thread::sleep_for(100ms);
  }
  EXPECT_TRUE(ClosedWithin(quiet.get(), 10000));
  EXPECT_TRUE(RoundTrip(talking.get(), kData));
  auto c = CountersOnce([](auto c) { return c.refused["idle"] == 1 && c.open == 1; });
  EXPECT_EQ(c.refused["idle"], 1u);
  EXPECT_EQ(c.open, 1u);
}

TEST_F(PeerPortTest, BytesThatAreNotTlsAreClosedAndNeverPassedOn) {
  Start();
  ScopedFd h2 = Connect();
  const std::string preface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
  ASSERT_EQ(::send(h2.get(), preface.data(), preface.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(preface.size()));
  EXPECT_TRUE(ClosedWithin(h2.get(), 5000));
  EXPECT_EQ(port_->counters().refused["not_tls"], 1u);
  EXPECT_EQ(backend_->bytes(), 0u);
}

TEST_F(PeerPortTest, SourceOfNamesTheTcpSourceOfWhatTheServerSees) {
  Start();
  ScopedFd a = Connect("127.0.0.2");
  ScopedFd b = Connect("127.0.0.3");
  ASSERT_TRUE(Handshake(a.get()));
  ASSERT_TRUE(Handshake(b.get()));
  std::map<std::string, int> by_source;
  for (const std::string& name : backend_->peers()) {
    EXPECT_EQ(name.rfind("unix-abstract:", 0), 0u) << name;
    by_source[port_->SourceOf(name)]++;
  }
  EXPECT_EQ(by_source.size(), 2u);
  EXPECT_EQ(by_source["ipv4:127.0.0.2:" + std::to_string(LocalPort(a.get()))], 1);
  EXPECT_EQ(by_source["ipv4:127.0.0.3:" + std::to_string(LocalPort(b.get()))], 1);
  EXPECT_EQ(port_->SourceOf("unix-abstract:nosuch"), "unix-abstract:nosuch");
  // Gone with its connection.
  const std::string name = backend_->peers().front();
  a.reset();
  b.reset();
  CountersOnce([](auto c) { return c.open == 0; });
  EXPECT_EQ(port_->SourceOf(name), name);
}

TEST_F(PeerPortTest, OutOfDescriptorsItBacksOffAndAcceptsOnceTheyAreBack) {
  Start();
  // Sockets made first: the test needs no descriptor once the limit is down.
  std::vector<ScopedFd> clients;
  for (int i = 0; i < 4; ++i)
    clients.emplace_back(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  // Every descriptor below the limit taken: accept(2) in the port gets EMFILE.
  DescriptorShortage shortage(256);
  ASSERT_TRUE(shortage.ok());
  sockaddr_in dst{};
  dst.sin_family = AF_INET;
  dst.sin_port = htons(static_cast<uint16_t>(port_->port()));
  dst.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  for (auto& c : clients) {
    ASSERT_EQ(::connect(c.get(), reinterpret_cast<sockaddr*>(&dst), sizeof dst), 0);
  }
  auto c = CountersOnce([](auto c) { return c.refused["descriptors"] >= 1; });
  EXPECT_GE(c.refused["descriptors"], 1u);  // backed off: waits for descriptors, not spinning
  EXPECT_LE(c.refused["descriptors"], 100u);
  EXPECT_FALSE(port_->healthy());
  EXPECT_EQ(c.open, 0u);
  shortage.Release();
  // The queued connections are taken once descriptors are back.
  c = CountersOnce([](auto c) { return c.open == 4; });
  EXPECT_EQ(c.open, 4u);
  EXPECT_TRUE(port_->healthy());
  for (auto& fd : clients) EXPECT_TRUE(Handshake(fd.get()));
}

// gRPC is asked to take a connection only once its client has sent its first bytes: an idle
// connection costs gRPC nothing (and the daemon one descriptor).
TEST_F(PeerPortTest, IdleConnectionsNeverReachGrpc) {
  Start();
  std::vector<ScopedFd> idle;
  for (int i = 0; i < 5; ++i) idle.push_back(Connect());
  auto c = CountersOnce([](auto c) { return c.open == 5; });
  EXPECT_EQ(c.open, 5u);
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(port_->counters().relayed, 0u);
  EXPECT_TRUE(backend_->peers().empty());
  ASSERT_TRUE(Handshake(idle[0].get()));
  EXPECT_EQ(port_->counters().relayed, 1u);
  EXPECT_EQ(backend_->peers().size(), 1u);
}

// gRPC 1.51's listener stops accepting for good after one EMFILE: a connection is handed to
// it only while 8 descriptors are free (its accept needs one), and waits meanwhile.
TEST_F(PeerPortTest, NoConnectionIsHandedToGrpcWithoutDescriptorsForIt) {
  Start();
  ScopedFd peer = Connect();
  CountersOnce([](auto c) { return c.open == 1; });
  {
    DescriptorShortage shortage(256);
    ASSERT_TRUE(shortage.ok());
    shortage.Free(4);  // fewer than 8
    ASSERT_EQ(::send(peer.get(), kHello.data(), kHello.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(kHello.size()));
    const auto until = std::chrono::steady_clock::now() + 5s;
    while (port_->healthy() && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(5ms);
    }
    EXPECT_FALSE(port_->healthy());
    std::this_thread::sleep_for(300ms);  // it keeps waiting, not handing over
    EXPECT_EQ(port_->counters().relayed, 0u);
    EXPECT_TRUE(backend_->peers().empty());
  }
  // Descriptors back: the waiting connection is handed over and served.
  auto c = CountersOnce([](auto c) { return c.relayed == 1; });
  EXPECT_EQ(c.relayed, 1u);
  EXPECT_TRUE(port_->healthy());
  std::string echo(kHello.size(), '\0');
  ASSERT_EQ(::recv(peer.get(), echo.data(), echo.size(), MSG_WAITALL),
            static_cast<ssize_t>(echo.size()));
  EXPECT_EQ(echo, kHello);
  EXPECT_TRUE(RoundTrip(peer.get(), kData));
}

// A gRPC that takes no connection (its listener gone): it is handed one, and until it has
// read that one's bytes the port takes no descriptor for another (each would need one in gRPC
// too); once that one is closed at its deadline, the next gets its turn.
TEST_F(PeerPortTest, AStalledServerIsHandedOneConnectionAtATime) {
  Start(1024, 64, /*handshake=*/1s, /*stalled=*/true);
  std::vector<ScopedFd> clients;
  for (int i = 0; i < 30; ++i) {
    clients.push_back(Connect());
    ASSERT_EQ(::send(clients.back().get(), kHello.data(), kHello.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(kHello.size()));
  }
  auto c = CountersOnce([](auto c) { return c.relayed == 1; });
  EXPECT_EQ(c.relayed, 1u);
  std::this_thread::sleep_for(300ms);
  c = port_->counters();
  EXPECT_EQ(c.relayed, 1u);
  EXPECT_EQ(c.refused["handshake_deadline"], 0u);
  // At their deadlines every one of them is closed, each handed over only once the one
  // before it went (those accepted later had later deadlines).
  c = CountersOnce([](auto c) { return c.refused["handshake_deadline"] == 30; });
  EXPECT_EQ(c.refused["handshake_deadline"], 30u);
  EXPECT_EQ(c.open, 0u);
  const uint64_t relayed = c.relayed;
  ScopedFd next = Connect();
  ASSERT_EQ(::send(next.get(), kHello.data(), kHello.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(kHello.size()));
  c = CountersOnce([&](auto c) { return c.relayed == relayed + 1; });
  EXPECT_EQ(c.relayed, relayed + 1);
}

TEST_F(PeerPortTest, StoppingAcceptingKeepsTheConnectionsUntilTheyAreClosed) {
  Start();
  ScopedFd peer = Connect();
  ASSERT_TRUE(Handshake(peer.get()));
  const int port = port_->port();
  port_->StopAccepting();
  EXPECT_FALSE(ConnectFrom("127.0.0.1", port));  // refused by the kernel
  EXPECT_TRUE(RoundTrip(peer.get(), kData));
  port_->CloseConnections();
  EXPECT_TRUE(ClosedWithin(peer.get(), 5000));
  EXPECT_EQ(port_->counters().open, 0u);
}

TEST_F(PeerPortTest, AnIpv6SourceIsNamedAsGrpcWould) {
  {
    ScopedFd probe(::socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_in6 a{};
    a.sin6_family = AF_INET6;
    a.sin6_addr = in6addr_loopback;
    if (!probe || ::bind(probe.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
      GTEST_SKIP() << "no IPv6 loopback here";
    }
  }
  backend_ = std::make_unique<EchoBackend>(dir_ / "grpc.sock");
  PeerPort::Options o;
  o.listen = "[::1]:0";
  o.backend_path = dir_ / "grpc.sock";
  auto p = PeerPort::Start(o);
  ASSERT_TRUE(p.ok()) << p.status();
  port_ = std::move(p).value();
  ScopedFd fd(::socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in6 dst{};
  dst.sin6_family = AF_INET6;
  dst.sin6_addr = in6addr_loopback;
  dst.sin6_port = htons(static_cast<uint16_t>(port_->port()));
  ASSERT_EQ(::connect(fd.get(), reinterpret_cast<sockaddr*>(&dst), sizeof dst), 0);
  ASSERT_TRUE(Handshake(fd.get()));
  sockaddr_in6 local{};
  socklen_t len = sizeof local;
  ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&local), &len);
  ASSERT_EQ(backend_->peers().size(), 1u);
  EXPECT_EQ(port_->SourceOf(backend_->peers()[0]),
            "ipv6:[::1]:" + std::to_string(ntohs(local.sin6_port)));
}

TEST_F(PeerPortTest, AnAddressInUseIsNamed) {
  Start();
  PeerPort::Options o;
  o.listen = "127.0.0.1:" + std::to_string(port_->port());
  o.backend_path = dir_ / "grpc.sock";
  auto second = PeerPort::Start(o);
  ASSERT_FALSE(second.ok());
  EXPECT_NE(second.status().message().find("peer API: cannot listen on " + o.listen +
                                           " (--peer_listen): bind"),
            std::string::npos)
      << second.status();
}

}  // namespace
}  // namespace weightcache::server
