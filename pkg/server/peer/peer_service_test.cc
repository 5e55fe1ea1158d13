// The peer API (issue 30) in process: a daemon on the host backend serving it on loopback
// TCP with mutual TLS; callers with the fleet's certificates, with another CA's, without a
// certificate and without TLS; transfers: every segment pulled over UCX (TCP) byte-equal to
// what engines map, exposures that lapse, and a daemon whose UCX did not start.
#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "pkg/metrics/metrics.h"
#include "pkg/peer/client.h"
#include "pkg/peer/testing/test_ca.h"
#include "pkg/peer/ucx_transfer.h"
#include "pkg/server/keeper/keeper_record.h"
#include "pkg/server/testing/in_process_daemon.h"
#include "pkg/util/scoped_fd.h"
#include "tests/testutil/tcp.h"
#include "weightcache/v1/peer.grpc.pb.h"

namespace weightcache::server {
namespace {

using weightcache::testing::ClosedNow;
using weightcache::testing::ConnectFrom;
using weightcache::testing::OpenDescriptors;

constexpr std::chrono::seconds kCall{10};

class PeerServiceTest : public testing::DaemonInProcessTest {
 protected:
  void SetUp() override {
    DaemonInProcessTest::SetUp();
    auto ca = peer::testing::TestCa::Create(dir_.path(), "fleet");
    ASSERT_TRUE(ca.ok()) << ca.status();
    fleet_ca_ = ca->ca_file();
    ca_ = *ca;
    auto server = ca->Issue("node-a", peer::kDefaultServerName);
    auto client = ca->Issue("node-b", peer::kDefaultServerName);
    ASSERT_TRUE(server.ok() && client.ok());
    server_files_ = {server->cert_file, server->key_file, fleet_ca_};
    client_files_ = {client->cert_file, client->key_file, fleet_ca_};
  }
  void StartWithPeerApi(std::chrono::milliseconds hold = std::chrono::seconds(120),
                        const std::function<void(PeerOptions&)>& more = {}) {
    DaemonOptions o;
    o.peer.listen = "127.0.0.1:0";
    o.peer.transfer_hold = hold;
    o.peer.tls = server_files_;
    if (more) more(o.peer);
    Start(std::move(o));
    ASSERT_GT(daemon_->peer_port(), 0);
    address_ = "127.0.0.1:" + std::to_string(daemon_->peer_port());
  }
  std::unique_ptr<peer::PeerClient> Peer(const peer::TlsFiles& files) {
    auto tls = peer::ReadTls(files);
    EXPECT_TRUE(tls.ok()) << tls.status();
    return peer::PeerClient::Make(address_, *tls);
  }
  // The fingerprint of "m", once it is ready.
  std::string ReadyFingerprint() {
    auto lease = Acquire();
    EXPECT_TRUE(lease.ok()) << lease.status();
    return lease.ok() ? (*lease)->fingerprint() : "";
  }

  std::string fleet_ca_, address_;
  std::optional<peer::testing::TestCa> ca_;
  peer::TlsFiles server_files_, client_files_;
};

TEST_F(PeerServiceTest, AFleetPeerGetsTheRecordOfAReadyEntryWithItsDigests) {
  StartWithPeerApi();
  const std::string fp = ReadyFingerprint();
  ASSERT_FALSE(fp.empty());
  auto r = Peer(client_files_)->Describe(fp, kCall);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->source(), "disk");
  EXPECT_GT(r->total_bytes(), 0u);
  auto rec = DecodeKeeperRecord(r->record());
  ASSERT_TRUE(rec.ok()) << rec.status();  // the inputs reproduce the fingerprint
  EXPECT_EQ(rec->record.fingerprint(), fp);
  EXPECT_EQ(rec->record.model(), "m");
  EXPECT_EQ(rec->record.backend(), "host");
  ASSERT_GT(rec->record.segment_sizes_size(), 0);
  // One digest per segment: what the filling daemon checks its copy against.
  EXPECT_EQ(rec->record.segment_sha256_size(), rec->record.segment_sizes_size());
}

TEST_F(PeerServiceTest, AFingerprintNotHeldIsNotFound) {
  StartWithPeerApi();
  ASSERT_FALSE(ReadyFingerprint().empty());
  auto r = Peer(client_files_)->Describe(std::string(64, 'a'), kCall);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound) << r.status();
  EXPECT_NE(r.status().message().find("no ready shared entry with fingerprint aaaaaaaaaaaa"),
            std::string::npos)
      << r.status();
  EXPECT_EQ(Peer(client_files_)->Describe("", kCall).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(PeerServiceTest, ACallerWithAnotherCasCertificateIsRefused) {
  StartWithPeerApi();
  const std::string fp = ReadyFingerprint();
  auto other = peer::testing::TestCa::Create(dir_.path(), "other");
  ASSERT_TRUE(other.ok());
  auto leaf = other->Issue("intruder", peer::kDefaultServerName);
  ASSERT_TRUE(leaf.ok());
  // Its certificate is not the fleet CA's (it trusts the fleet CA, so only the server's
  // check of the client refuses it).
  auto r = Peer({leaf->cert_file, leaf->key_file, fleet_ca_})->Describe(fp, kCall);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
  EXPECT_FALSE(r.ok());
}

// Issue 48: the fleet CA may sign other certificates (a webhook's, an operator's); a caller
// is a peer only when its certificate carries the fleet's peer name. Before, any certificate
// of the CA was answered. The answering daemon's name reaches the caller (per-node
// identities are what a quorum counts).
TEST_F(PeerServiceTest, ACertificateOfTheFleetCaWithoutThePeerNameIsRefused) {
  StartWithPeerApi();
  const std::string fp = ReadyFingerprint();
  auto webhook = ca_->Issue("webhook", "weightcache-webhook.weightcache.svc");
  ASSERT_TRUE(webhook.ok()) << webhook.status();
  auto r = Peer({webhook->cert_file, webhook->key_file, fleet_ca_})->Describe(fp, kCall);
  ASSERT_EQ(r.status().code(), absl::StatusCode::kPermissionDenied) << r.status();
  EXPECT_NE(r.status().message().find("certificate 'webhook' does not carry the fleet's peer "
                                      "name 'weightcache-peer'"),
            std::string::npos)
      << r.status();
  std::string identity;
  auto ok = Peer(client_files_)->Describe(fp, kCall, false, &identity);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(identity, "node-a");
}

TEST_F(PeerServiceTest, ACallerWithoutACertificateOrWithoutTlsIsRefused) {
  StartWithPeerApi();
  const std::string fp = ReadyFingerprint();
  v1::PeerDescribeRequest req;
  req.set_fingerprint(fp);
  auto tls = peer::ReadTls(client_files_);
  ASSERT_TRUE(tls.ok());
  {  // TLS, trusting the fleet CA, but no client certificate
    grpc::SslCredentialsOptions o;
    o.pem_root_certs = tls->ca_pem;
    grpc::ChannelArguments args;
    args.SetSslTargetNameOverride(peer::kDefaultServerName);
    auto stub = v1::WeightCachePeer::NewStub(
        grpc::CreateCustomChannel(address_, grpc::SslCredentials(o), args));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + kCall);
    v1::PeerDescribeResponse resp;
    EXPECT_EQ(stub->Describe(&ctx, req, &resp).error_code(), grpc::StatusCode::UNAVAILABLE);
    EXPECT_TRUE(resp.record().empty());
  }
  {  // plaintext
    auto stub = v1::WeightCachePeer::NewStub(
        grpc::CreateChannel(address_, grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + kCall);
    v1::PeerDescribeResponse resp;
    EXPECT_EQ(stub->Describe(&ctx, req, &resp).error_code(), grpc::StatusCode::UNAVAILABLE);
    EXPECT_TRUE(resp.record().empty());
  }
  // The fleet's own still gets it: the refusals were about the callers.
  EXPECT_TRUE(Peer(client_files_)->Describe(fp, kCall).ok());
}

TEST_F(PeerServiceTest, TheClientRefusesAServerWhoseCertificateIsNotTheFleets) {
  auto other = peer::testing::TestCa::Create(dir_.path(), "other");
  ASSERT_TRUE(other.ok());
  auto leaf = other->Issue("impostor", peer::kDefaultServerName);
  ASSERT_TRUE(leaf.ok());
  // The impostor daemon trusts the fleet CA (it would accept our client) but its own
  // certificate is another CA's: our client must not talk to it.
  server_files_ = {leaf->cert_file, leaf->key_file, fleet_ca_};
  StartWithPeerApi();
  const std::string fp = ReadyFingerprint();
  auto r = Peer(client_files_)->Describe(fp, kCall);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
}

TEST_F(PeerServiceTest, ABadTlsFileStopsTheStartAndIsNamed) {
  DaemonOptions o;
  o.peer.listen = "127.0.0.1:0";
  o.peer.tls = server_files_;
  o.peer.tls.key_file = dir_ / "nope.key";
  o.socket_dir = dir_ / "s";
  auto d = Daemon::Start(std::move(o), backend_.get());
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().message(), "peer TLS key " + (dir_ / "nope.key") + ": cannot be read");
}

class PeerTransferTest : public PeerServiceTest {
 protected:
  void SetUp() override {
    ::setenv("UCX_TLS", "tcp", 1);
    PeerServiceTest::SetUp();
  }
  void TearDown() override { ::unsetenv("UCX_TLS"); }
  // Pulls region `i` of `t` into `out` (resized to its length).
  absl::Status PullRegion(const v1::PeerTransfer& t, int i, std::vector<char>* out) {
    if (puller_ == nullptr) {
      auto p = peer::UcxPuller::Create();
      if (!p.ok()) return p.status();
      puller_ = std::move(p).value();
    }
    out->assign(t.regions(i).length(), 0);
    peer::PullOptions o;
    o.timeout = std::chrono::seconds(30);
    return puller_->Pull(t.worker_address(), t.regions(i).token(), 0, out->data(), out->size(), o);
  }
  std::unique_ptr<peer::UcxPuller> puller_;
};

TEST_F(PeerTransferTest, APeerPullsEverySegmentByteEqualToWhatEnginesMap) {
  StartWithPeerApi();
  auto lease = Acquire();
  ASSERT_TRUE(lease.ok()) << lease.status();
  auto r = Peer(client_files_)->Describe((*lease)->fingerprint(), kCall, /*transfer=*/true);
  ASSERT_TRUE(r.ok()) << r.status();
  const v1::PeerTransfer& t = r->transfer();
  EXPECT_FALSE(t.worker_address().empty());
  EXPECT_EQ(t.hold_ms(), 120000u);
  ASSERT_EQ(static_cast<size_t>(t.regions_size()), (*lease)->segment_count());
  auto rec = DecodeKeeperRecord(r->record());
  ASSERT_TRUE(rec.ok()) << rec.status();
  ASSERT_EQ(rec->record.segment_sizes_size(), t.regions_size());
  uint64_t pulled = 0;
  for (int i = 0; i < t.regions_size(); ++i) {
    EXPECT_EQ(t.regions(i).length(), rec->record.segment_sizes(i));
    EXPECT_EQ(t.regions(i).token().size(), peer::kTokenBytes);
    std::vector<char> bytes;
    ASSERT_TRUE(PullRegion(t, i, &bytes).ok());
    ASSERT_LE(bytes.size(), (*lease)->segment_size(i));
    EXPECT_EQ(std::memcmp(bytes.data(), (*lease)->segment_base(i), bytes.size()), 0)
        << "segment " << i;
    pulled += bytes.size();
  }
  EXPECT_EQ(pulled, r->total_bytes());
  // Without `transfer`, nothing is exposed.
  auto plain = Peer(client_files_)->Describe((*lease)->fingerprint(), kCall);
  ASSERT_TRUE(plain.ok());
  EXPECT_FALSE(plain->has_transfer());
}

TEST_F(PeerTransferTest, AnExposureLapsesAfterItsHoldAndADescribeExposesAgain) {
  StartWithPeerApi(std::chrono::milliseconds(300));
  const std::string fp = ReadyFingerprint();
  auto first = Peer(client_files_)->Describe(fp, kCall, true);
  ASSERT_TRUE(first.ok()) << first.status();
  std::vector<char> bytes;
  ASSERT_TRUE(PullRegion(first->transfer(), 0, &bytes).ok());
  // Lapsed: its token no longer reads anything (the reaper runs at the hold's end).
  absl::Status s;
  for (int i = 0; i < 200; ++i) {
    s = PullRegion(first->transfer(), 0, &bytes);
    if (s.code() == absl::StatusCode::kNotFound) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  // A new Describe exposes the segments again, under new tokens.
  auto second = Peer(client_files_)->Describe(fp, kCall, true);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_NE(second->transfer().regions(0).token(), first->transfer().regions(0).token());
  EXPECT_TRUE(PullRegion(second->transfer(), 0, &bytes).ok());
}

TEST_F(PeerTransferTest, WithoutUcxRecordsAreStillDescribedAndTransfersRefusedByName) {
  ::setenv("UCX_TLS", "no-such-transport", 1);
  StartWithPeerApi();
  const std::string fp = ReadyFingerprint();
  EXPECT_TRUE(Peer(client_files_)->Describe(fp, kCall).ok());
  auto r = Peer(client_files_)->Describe(fp, kCall, true);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
  EXPECT_NE(r.status().message().find("no transfers from this daemon: UCX"), std::string::npos)
      << r.status();
}

// Finding (issue 47): the peer port accepted any number of TCP connections before TLS; 3 x
// 6,700 idle ones took all 20,000 of the daemon's descriptors and a peer's Describe timed out.
// Now the port holds at most --peer_max_connections (per source address
// --peer_max_connections_per_address), closes the rest, makes room for a newcomer by closing
// the oldest connection still in its handshake, and closes every connection that completes
// no handshake by --peer_handshake_timeout_ms (one that never sends a byte is closed at the
// door, the acceptor, by the same deadline).
TEST_F(PeerServiceTest, AFloodOfIdleConnectionsIsBoundedAndAPeerStillGetsItsAnswer) {
  constexpr size_t kCap = 64, kPerAddress = 16;
  StartWithPeerApi(std::chrono::seconds(120), [](PeerOptions& p) {
    p.max_connections = kCap;
    p.max_connections_per_address = kPerAddress;
    p.handshake_timeout = std::chrono::seconds(3);
  });
  const std::string fp = ReadyFingerprint();
  ASSERT_FALSE(fp.empty());
  // The port's listener row (its connections and refusals at the door and in the handshake)
  // and what it relayed.
  struct Counters {
    bool present = false;
    uint64_t open = 0, relayed = 0;
    std::map<std::string, uint64_t> refused;
  };
  auto counters = [this] {
    Counters c;
    for (auto& l : daemon_->state_source()->Listeners()) {
      if (l.listener != "peer") continue;
      c.present = true;
      c.open = l.open;
      c.refused = l.refused;
    }
    c.relayed = daemon_->state_source()->PeerPortState().relayed;
    return c;
  };
  auto counters_once = [&](const std::function<bool(Counters)>& done) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    auto c = counters();
    while (!done(c) && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      c = counters();
    }
    return c;
  };
  ASSERT_TRUE(counters().present);
  const size_t fds_before = OpenDescriptors();
  const int port = daemon_->peer_port();
  std::vector<ScopedFd> flood;
  // 300 idle connections from one address: it keeps its 16.
  for (int i = 0; i < 300; ++i) flood.push_back(ConnectFrom("127.0.0.2", port));
  auto c = counters_once([](auto c) { return c.refused["per_key"] == 300 - kPerAddress; });
  EXPECT_EQ(c.refused["per_key"], 300 - kPerAddress);
  EXPECT_EQ(c.open, kPerAddress);
  // 300 more from 30 addresses, 10 each: the total cap holds, each newcomer closing the
  // oldest connection still in its handshake.
  for (int i = 0; i < 300; ++i) {
    flood.push_back(ConnectFrom("127.0.0." + std::to_string(3 + i % 30), port));
  }
  c = counters_once([](auto c) { return c.refused["total"] == kPerAddress + 300 - kCap; });
  EXPECT_EQ(c.refused["total"], kPerAddress + 300 - kCap);
  EXPECT_EQ(c.open, kCap);
  for (const auto& fd : flood) ASSERT_TRUE(fd) << "a connect failed";
  // (a) The connections past the caps were closed by the daemon, the newest ones kept.
  size_t closed = 0;
  for (int tries = 0; tries < 300 && closed != 600 - kCap; ++tries) {
    closed = 0;
    for (const auto& fd : flood) closed += ClosedNow(fd.get()) ? 1 : 0;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(closed, 600 - kCap);
  for (size_t i = flood.size() - kCap; i < flood.size(); ++i) {
    EXPECT_FALSE(ClosedNow(flood[i].get())) << i;
  }
  // (b) The daemon's descriptors are bounded: one per connection it holds, whatever the
  // flood (idle connections never reach gRPC; a relayed one would cost three). The test's own
  // 600 sockets are in the count too. Before: one per connection, 600, in gRPC.
  const size_t fds_flood = OpenDescriptors();
  EXPECT_LE(fds_flood, fds_before + flood.size() + kCap + 16)
      << fds_before << " descriptors before";
  EXPECT_EQ(c.relayed, 0u);
  // (c) A fleet peer still gets its answer, from 127.0.0.1, during the flood: its connection
  // takes the place of the oldest one still in its handshake.
  auto peer = Peer(client_files_);  // kept: its connection stays open
  auto r = peer->Describe(fp, kCall);
  EXPECT_TRUE(r.ok()) << r.status();
  c = counters();
  EXPECT_EQ(c.refused["total"], kPerAddress + 300 - kCap + 1);
  EXPECT_EQ(c.open, kCap);
  // (d) The flood's connections complete no handshake: closed at the deadline; the peer's
  // stays.
  // (They never sent a byte: the door closes them, they never reached the port.)
  c = counters_once([](auto c) { return c.open == 1; });
  EXPECT_EQ(c.open, 1u);
  EXPECT_EQ(c.refused["first_byte"], kCap - 1);
  EXPECT_EQ(c.refused["handshake_deadline"], 0u);
  EXPECT_EQ(c.refused["not_tls"], 0u);
  EXPECT_EQ(c.refused["descriptors"], 0u);
  for (const auto& fd : flood) EXPECT_TRUE(ClosedNow(fd.get()));
  flood.clear();
  EXPECT_TRUE(peer->Describe(fp, kCall).ok());
  EXPECT_LE(OpenDescriptors(), fds_before + 1 + 3 + 16);  // the peer's connection, both ends
}

TEST_F(PeerServiceTest, WithoutListenThereIsNoPeerApi) {
  Start(DaemonOptions{});
  EXPECT_EQ(daemon_->peer_port(), 0);
}

}  // namespace
}  // namespace weightcache::server
