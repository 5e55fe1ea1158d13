// Finding the peers that hold a fingerprint (issue 30): real daemons serving the peer API on
// loopback TCP with mutual TLS, one holding "m" ready, one not, and a port nobody serves.
#include "pkg/peer/peer_set.h"

#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>

#include "gtest/gtest.h"
#include "pkg/peer/testing/test_ca.h"
#include "pkg/server/keeper/keeper_record.h"
#include "pkg/server/testing/in_process_daemon.h"
#include "pkg/util/scoped_fd.h"

namespace weightcache::server {
namespace {

using peer::PeerName;
using peer::PeerSet;
using peer::PeerSetOptions;

// A loopback port nothing listens on (bound, then closed).
uint16_t UnservedPort() {
  ScopedFd s(::socket(AF_INET, SOCK_STREAM, 0));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::bind(s.get(), reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  socklen_t len = sizeof a;
  EXPECT_EQ(::getsockname(s.get(), reinterpret_cast<sockaddr*>(&a), &len), 0);
  return ntohs(a.sin_port);
}

std::string Loopback(uint16_t port) { return "127.0.0.1:" + std::to_string(port); }

class PeerSetTest : public testing::DaemonInProcessTest {
 protected:
  void SetUp() override {
    DaemonInProcessTest::SetUp();
    auto ca = peer::testing::TestCa::Create(dir_.path(), "fleet");
    ASSERT_TRUE(ca.ok()) << ca.status();
    auto server = ca->Issue("node-a", peer::kDefaultServerName);
    auto client = ca->Issue("node-c", peer::kDefaultServerName);
    ASSERT_TRUE(server.ok() && client.ok());
    server_files_ = {server->cert_file, server->key_file, ca->ca_file()};
    auto tls = peer::ReadTls({client->cert_file, client->key_file, ca->ca_file()});
    ASSERT_TRUE(tls.ok()) << tls.status();
    client_tls_ = *tls;

    // A: holds "m" ready.
    DaemonOptions a;
    a.peer.listen = "127.0.0.1:0";
    a.peer.tls = server_files_;
    Start(std::move(a));
    auto lease = Acquire();
    ASSERT_TRUE(lease.ok()) << lease.status();
    fingerprint_ = (*lease)->fingerprint();
    port_a_ = static_cast<uint16_t>(daemon_->peer_port());
    // B: knows "m", never loaded it.
    port_b_ = StartSecond(0);
  }
  // Another daemon on its own socket directory, serving the peer API on `port` (0: any).
  uint16_t StartSecond(uint16_t port) {
    // Knows "m", never loads it (preloaded, it would hold it too).
    DaemonOptions o = OtherDaemonOptions("s" + std::to_string(others_.size() + 2), false);
    o.peer.listen = Loopback(port);
    o.peer.tls = server_files_;
    auto d = Daemon::Start(std::move(o), backend_.get());
    EXPECT_TRUE(d.ok()) << d.status();
    if (!d.ok()) return 0;
    others_.push_back(std::move(d).value());
    return static_cast<uint16_t>(others_.back()->peer_port());
  }
  PeerSetOptions Options(std::vector<PeerName> peers) {
    PeerSetOptions o;
    o.peers = std::move(peers);
    o.tls = client_tls_;
    o.describe_timeout = std::chrono::seconds(10);
    return o;
  }

  peer::TlsFiles server_files_;
  peer::TlsMaterial client_tls_;
  std::string fingerprint_;
  uint16_t port_a_ = 0, port_b_ = 0;
  std::vector<std::unique_ptr<Daemon>> others_;
};

TEST_F(PeerSetTest, ASurveyTellsTheHolderFromPeersWithoutItAndFromPeersUnreachable) {
  const uint16_t dead = UnservedPort();
  PeerSet set(Options({{"127.0.0.1", port_a_}, {"127.0.0.1", port_b_}, {"127.0.0.1", dead}}));
  const peer::PeerSurvey s = set.Survey(fingerprint_);
  EXPECT_EQ(s.asked(), 3u);
  ASSERT_EQ(s.holders.size(), 1u);
  EXPECT_EQ(s.holders[0].address, Loopback(port_a_));
  EXPECT_EQ(s.holders[0].response.source(), "disk");
  auto rec = DecodeKeeperRecord(s.holders[0].response.record());
  ASSERT_TRUE(rec.ok()) << rec.status();
  EXPECT_EQ(rec->record.fingerprint(), fingerprint_);
  EXPECT_EQ(s.without, std::vector<std::string>{Loopback(port_b_)});
  ASSERT_EQ(s.failures.size(), 1u);
  EXPECT_EQ(s.failures[0].address, Loopback(dead));
  EXPECT_EQ(s.failures[0].status.code(), absl::StatusCode::kUnavailable) << s.failures[0].status;

  // A fingerprint nobody holds: every reachable peer says so.
  const peer::PeerSurvey none = set.Survey(std::string(64, 'e'));
  EXPECT_TRUE(none.holders.empty());
  EXPECT_EQ(none.without.size(), 2u);
}

TEST_F(PeerSetTest, ANameStandsForEveryAddressItResolvesToEachAskedOnce) {
  // "localhost" resolves to 127.0.0.1 (and maybe ::1, where nothing listens); named twice,
  // once by name and once by address, 127.0.0.1 is still asked once.
  PeerSet set(Options({{"localhost", port_a_}, {"127.0.0.1", port_a_}}));
  const std::vector<std::string> addresses = set.Resolve(nullptr);
  EXPECT_EQ(std::count(addresses.begin(), addresses.end(), Loopback(port_a_)), 1);
  const peer::PeerSurvey s = set.Survey(fingerprint_);
  EXPECT_EQ(s.asked(), addresses.size());
  ASSERT_EQ(s.holders.size(), 1u);
  EXPECT_EQ(s.holders[0].address, Loopback(port_a_));
}

TEST_F(PeerSetTest, ItsOwnAddressIsLeftOut) {
  // As daemon A: a headless Service lists A itself among the peers.
  PeerSetOptions o = Options({{"127.0.0.1", port_a_}, {"127.0.0.1", port_b_}});
  o.self_port = port_a_;
  PeerSet set(std::move(o));
  EXPECT_EQ(set.Resolve(nullptr), std::vector<std::string>{Loopback(port_b_)});
  const peer::PeerSurvey s = set.Survey(fingerprint_);
  EXPECT_TRUE(s.holders.empty());
  EXPECT_EQ(s.without, std::vector<std::string>{Loopback(port_b_)});
}

TEST_F(PeerSetTest, ANameThatDoesNotResolveIsAFailureAndTheOthersAreStillAsked) {
  PeerSet set(Options({{"no-such-peer.invalid", 7443}, {"127.0.0.1", port_a_}}));
  const peer::PeerSurvey s = set.Survey(fingerprint_);
  ASSERT_EQ(s.holders.size(), 1u);
  ASSERT_EQ(s.failures.size(), 1u);
  EXPECT_EQ(s.failures[0].address, "no-such-peer.invalid:7443");
  EXPECT_EQ(s.failures[0].status.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(s.failures[0].status.message().find("peer no-such-peer.invalid: does not resolve"),
            std::string::npos)
      << s.failures[0].status;
}

// The first survey's failed call leaves its channel in gRPC's reconnect backoff (a second,
// then more): kept, it would fail the next survey at once although the peer is back.
TEST_F(PeerSetTest, APeerThatComesBackIsFoundByTheNextSurvey) {
  const uint16_t port = UnservedPort();
  PeerSet set(Options({{"127.0.0.1", port}}));
  EXPECT_EQ(set.Survey(fingerprint_).failures.size(), 1u);
  ASSERT_EQ(StartSecond(port), port);
  const peer::PeerSurvey s = set.Survey(fingerprint_);
  EXPECT_TRUE(s.failures.empty()) << s.failures[0].status;
  EXPECT_EQ(s.without, std::vector<std::string>{Loopback(port)});
}

TEST(PeerNameTest, EntriesParseAndBadOnesAreNamed) {
  auto v4 = peer::ParsePeerName("10.0.0.7:7443");
  ASSERT_TRUE(v4.ok());
  EXPECT_EQ(v4->host, "10.0.0.7");
  EXPECT_EQ(v4->port, 7443);
  auto v6 = peer::ParsePeerName("[fd00::7]:7443");
  ASSERT_TRUE(v6.ok());
  EXPECT_EQ(v6->host, "fd00::7");
  auto dns = peer::ParsePeerList("weightcache-peers.weightcache.svc:7443,node-b:7500");
  ASSERT_TRUE(dns.ok());
  ASSERT_EQ(dns->size(), 2u);
  EXPECT_EQ((*dns)[1].host, "node-b");
  EXPECT_EQ((*dns)[1].port, 7500);

  const std::vector<std::pair<std::string, std::string>> bad = {
      {"node-b", "peer 'node-b': no port (host:port, [IPv6]:port)"},
      {"node-b:", "peer 'node-b:': the port is not a number in 1..65535"},
      {"node-b:0", "peer 'node-b:0': the port is not a number in 1..65535"},
      {"node-b:65536", "peer 'node-b:65536': the port is not a number in 1..65535"},
      {"node-b:74x3", "peer 'node-b:74x3': the port is not a number in 1..65535"},
      {":7443", "peer ':7443': no host"},
      {"fd00::7:7443", "peer 'fd00::7:7443': an IPv6 address is written [addr]:port"},
      {"[fd00::7:7443", "peer '[fd00::7:7443': '[' without ']'"},
      {"[fd00::7]7443", "peer '[fd00::7]7443': no port (host:port, [IPv6]:port)"},
  };
  for (const auto& [entry, message] : bad) {
    auto r = peer::ParsePeerName(entry);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << entry;
    EXPECT_EQ(r.status().message(), message);
  }
  EXPECT_EQ(peer::ParsePeerList("a:1,,b:2").status().message(),
            "peer list 'a:1,,b:2': an empty entry (a stray comma?)");
  EXPECT_FALSE(peer::ParsePeerList("").ok());
}

}  // namespace
}  // namespace weightcache::server
