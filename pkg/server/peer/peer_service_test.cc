// The peer API (issue 30) in process: a daemon on the host backend serving it on loopback
// TCP with mutual TLS; callers with the fleet's certificates, with another CA's, without a
// certificate and without TLS; transfers: every segment pulled over UCX (TCP) byte-equal to
// what engines map, exposures that lapse, and a daemon whose UCX did not start.
#include <grpcpp/grpcpp.h>

#include <cstring>
#include <thread>

#include "gtest/gtest.h"
#include "pkg/peer/client.h"
#include "pkg/peer/testing/test_ca.h"
#include "pkg/peer/ucx_transfer.h"
#include "pkg/server/keeper/keeper_record.h"
#include "pkg/server/testing/in_process_daemon.h"
#include "weightcache/v1/peer.grpc.pb.h"

namespace weightcache::server {
namespace {

constexpr std::chrono::seconds kCall{10};

class PeerServiceTest : public testing::DaemonInProcessTest {
 protected:
  void SetUp() override {
    DaemonInProcessTest::SetUp();
    auto ca = peer::testing::TestCa::Create(dir_.path(), "fleet");
    ASSERT_TRUE(ca.ok()) << ca.status();
    fleet_ca_ = ca->ca_file();
    auto server = ca->Issue("node-a", peer::kDefaultServerName);
    auto client = ca->Issue("node-b", peer::kDefaultServerName);
    ASSERT_TRUE(server.ok() && client.ok());
    server_files_ = {server->cert_file, server->key_file, fleet_ca_};
    client_files_ = {client->cert_file, client->key_file, fleet_ca_};
  }
  void StartWithPeerApi(std::chrono::milliseconds hold = std::chrono::seconds(120)) {
    DaemonOptions o;
    o.peer.listen = "127.0.0.1:0";
    o.peer.transfer_hold = hold;
    o.peer.tls = server_files_;
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
  EXPECT_EQ(rec->record.segment_digest_folds_size(), rec->record.segment_sizes_size());
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

TEST_F(PeerServiceTest, WithoutListenThereIsNoPeerApi) {
  Start(DaemonOptions{});
  EXPECT_EQ(daemon_->peer_port(), 0);
}

}  // namespace
}  // namespace weightcache::server
