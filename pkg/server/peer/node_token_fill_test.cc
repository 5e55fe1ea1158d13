// Peer fill with node tokens (issue 57): whole daemons in process, every one holding the SAME
// peer certificate (the chart's default: one certificate for the fleet) and proving its node
// with a token a test-played API server signs for its pod (pkg/nodeid/testing). A quorum counts
// distinct verified nodes: two holders on two nodes fill a third daemon by quorum, which
// certificate names alone never allow; two holders behind one node count once; a holder that
// presents no token counts for nothing.
#include <prometheus/registry.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstring>
#include <map>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "pkg/metrics/metrics.h"
#include "pkg/nodeid/testing/fake_api_server.h"
#include "pkg/peer/client.h"
#include "pkg/peer/testing/corrupt_peer.h"
#include "pkg/peer/testing/test_ca.h"
#include "pkg/server/daemon.h"
#include "pkg/server/testing/in_process_daemon.h"
#include "pkg/server/testing/metric_sample.h"
#include "weightcache/v1/weightcache.pb.h"

namespace weightcache::server {
namespace {

class NodeTokenFillTest : public testing::DaemonInProcessTest {
 protected:
  void SetUp() override {
    ::setenv("UCX_TLS", "tcp", 1);
    DaemonInProcessTest::SetUp();
    auto ca = peer::testing::TestCa::Create(dir_.path(), "fleet");
    ASSERT_TRUE(ca.ok()) << ca.status();
    // One certificate, one name, for every daemon.
    auto cert = ca->Issue("fleet-peer", peer::kDefaultServerName);
    ASSERT_TRUE(cert.ok()) << cert.status();
    tls_ = {cert->cert_file, cert->key_file, ca->ca_file()};
    auto api = nodeid::testing::FakeApiServer::Start(dir_ / "api", {});
    ASSERT_TRUE(api.ok()) << api.status();
    api_server_ = *std::move(api);
  }
  void TearDown() override {
    forgers_.clear();
    leases_.clear();
    clients_.clear();
    daemons_.clear();
    ::unsetenv("UCX_TLS");
  }

  // Daemon `name`, in pod `name` on node `node`, serving the peer API and asking `peers`; with
  // `identity` kCertificate it neither presents nor checks tokens. With `load`, it loads "m"
  // from disk. Returns its peer port (0 on failure).
  uint16_t StartDaemon(const std::string& name, const std::string& node,
                       std::vector<uint16_t> peers, bool load,
                       PeerIdentity identity = PeerIdentity::kToken,
                       metrics::Metrics* m = nullptr) {
    DaemonOptions o = OtherDaemonOptions(name, load);
    o.peer.listen = "127.0.0.1:0";
    o.peer.tls = tls_;
    for (uint16_t p : peers) o.peer.peers.push_back({"127.0.0.1", p});
    o.peer.describe_timeout = std::chrono::seconds(10);
    o.peer.identity = identity;
    auto kube = api_server_->AddPod(
        {.name = name, .uid = "uid-" + name, .node = node, .node_uid = "nuid-" + node});
    EXPECT_TRUE(kube.ok()) << kube.status();
    if (!kube.ok()) return 0;
    o.peer.kube = *kube;
    o.peer.node_name = node;
    o.peer.pod = {name, "uid-" + name};
    o.metrics = m;
    auto d = Daemon::Start(std::move(o), backend_.get());
    EXPECT_TRUE(d.ok()) << d.status();
    if (!d.ok()) return 0;
    daemons_.push_back(*std::move(d));
    auto c = client::Client::Connect(dir_ / name);
    EXPECT_TRUE(c.ok()) << c.status();
    if (!c.ok()) return 0;
    clients_[name] = *std::move(c);
    if (load && Acquire(name) == nullptr) return 0;
    return static_cast<uint16_t>(daemons_.back()->peer_port());
  }
  // "m" acquired on `name` (filled, or loaded on a miss); the lease stays held.
  const client::Lease* Acquire(const std::string& name) {
    client::AcquireOptions o;
    o.model = "m";
    o.wait_ready = true;
    o.load_on_miss = true;
    o.timeout = std::chrono::seconds(60);
    auto lease = clients_.at(name)->Acquire(o);
    EXPECT_TRUE(lease.ok()) << lease.status();
    if (!lease.ok()) return nullptr;
    leases_.push_back(*std::move(lease));
    return leases_.back().get();
  }
  v1::EntryInfo EntryOf(const std::string& name) {
    auto st = clients_.at(name)->Status();
    EXPECT_TRUE(st.ok()) << st.status();
    for (const auto& e : st->entries()) {
      if (e.model() == "m") return e;
    }
    ADD_FAILURE() << "no entry of m at " << name;
    return {};
  }
  static void ExpectSameBytes(const client::Lease& a, const client::Lease& b) {
    ASSERT_EQ(a.fingerprint(), b.fingerprint());
    ASSERT_EQ(a.segment_count(), b.segment_count());
    for (size_t i = 0; i < a.segment_count(); ++i) {
      ASSERT_EQ(a.segment_size(i), b.segment_size(i));
      EXPECT_EQ(std::memcmp(a.segment_base(i), b.segment_base(i), a.segment_size(i)), 0)
          << "segment " << i;
    }
  }
  // A fleet member gone bad (peer::testing::CorruptPeer) holding the SAME certificate: it
  // serves a self-consistent forged copy of "m" taken from the honest daemon at `honest`, and
  // plays that daemon's tokens as `play` says. Returns its port (0 on failure).
  uint16_t StartForger(uint16_t honest, peer::testing::CorruptPeerOptions::TokenPlay play) {
    auto client_tls = peer::ReadTls(tls_);
    EXPECT_TRUE(client_tls.ok()) << client_tls.status();
    if (!client_tls.ok()) return 0;
    peer::testing::CorruptPeerOptions co;
    co.server_files = tls_;
    co.client_tls = *client_tls;
    co.honest_address = "127.0.0.1:" + std::to_string(honest);
    co.fingerprint = leases_.at(0)->fingerprint();
    co.bad_segment = 0;
    co.forge_record = true;
    co.token_play = play;
    co.replay_as_node = "node-b";  // the victim's name: the token is even made for it
    auto f = peer::testing::CorruptPeer::Start(co);
    EXPECT_TRUE(f.ok()) << f.status();
    if (!f.ok()) return 0;
    forgers_.push_back(*std::move(f));
    return static_cast<uint16_t>(forgers_.back()->port());
  }
  // Two honest holders (node-a, node-c) and, in front of each, a forger serving the same forged
  // copy of "m" that plays that holder's tokens as `play` says; B (node-b) asks the two forgers
  // only. Neither may count: B reads the disk and serves the checkpoint's bytes. Either way the
  // honest daemons gave one token each.
  void ForgersInFrontOfTwoHoldersCountForNothing(
      peer::testing::CorruptPeerOptions::TokenPlay play) {
    const uint16_t a = StartDaemon("a", "node-a", {}, /*load=*/true);
    const uint16_t c = StartDaemon("c", "node-c", {}, /*load=*/true);
    ASSERT_TRUE(a != 0 && c != 0);
    const uint16_t m1 = StartForger(a, play);
    const uint16_t m2 = StartForger(c, play);
    ASSERT_TRUE(m1 != 0 && m2 != 0);
    ASSERT_NE(StartDaemon("b", "node-b", {m1, m2}, false, PeerIdentity::kToken, &metrics_), 0);
    const client::Lease* b = Acquire("b");
    ASSERT_NE(b, nullptr);
    ExpectSameBytes(*b, *leases_[0]);
    EXPECT_EQ(EntryOf("b").source(), "disk");
    EXPECT_EQ(
        Sample("weightcache_peer_fill_fallbacks_total", {{"model", "m"}, {"reason", "anchor"}}), 1);
    EXPECT_EQ(api_server_->token_requests(), 2);
  }
  double Sample(const std::string& name, const std::map<std::string, std::string>& labels) {
    return testing::Sample(registry_, name, labels, 0);
  }

  peer::TlsFiles tls_;
  std::unique_ptr<nodeid::testing::FakeApiServer> api_server_;
  prometheus::Registry registry_;
  metrics::Metrics metrics_{registry_, {}};
  std::vector<std::unique_ptr<Daemon>> daemons_;
  std::map<std::string, std::unique_ptr<client::Client>> clients_;
  std::vector<std::unique_ptr<client::Lease>> leases_;
  std::vector<std::unique_ptr<peer::testing::CorruptPeer>> forgers_;
};

// The chart's default (one certificate for every node, trust quorum) with three nodes: two hold
// "m" from disk, the third fills by quorum once each holder proves its node with a token, and
// reads no checkpoint byte. With certificate identities (before issue 57) the same fleet is one
// name and the third reads the disk (reason "anchor").
TEST_F(NodeTokenFillTest, ServiceAccountTokenQuorumFormsWithOneSharedCertificate) {
  const uint16_t a = StartDaemon("a", "node-a", {}, /*load=*/true);
  const uint16_t c = StartDaemon("c", "node-c", {}, /*load=*/true);
  ASSERT_TRUE(a != 0 && c != 0);
  ASSERT_NE(StartDaemon("b", "node-b", {a, c}, false, PeerIdentity::kToken, &metrics_), 0);
  const client::Lease* filled = Acquire("b");
  ASSERT_NE(filled, nullptr);
  ExpectSameBytes(*filled, *leases_[0]);
  const v1::EntryInfo e = EntryOf("b");
  EXPECT_EQ(e.source(), "peer_fill");
  EXPECT_EQ(e.bytes_read(), 0u);
  EXPECT_EQ(Sample("weightcache_peer_fill_anchor_total", {{"model", "m"}, {"anchor", "quorum"}}),
            1);
  EXPECT_EQ(Sample("weightcache_peer_fill_fallbacks_total", {{"model", "m"}}), 0);
  EXPECT_EQ(api_server_->token_requests(), 2);  // one per holder, for this call

  // The same fleet told apart by certificate names: one name, no quorum.
  prometheus::Registry old_registry;
  metrics::Metrics old_metrics{old_registry, {}};
  ASSERT_NE(StartDaemon("d", "node-d", {a, c}, false, PeerIdentity::kCertificate, &old_metrics), 0);
  ASSERT_NE(Acquire("d"), nullptr);
  EXPECT_EQ(EntryOf("d").source(), "disk");
  EXPECT_EQ(testing::Sample(old_registry, "weightcache_peer_fill_fallbacks_total",
                            {{"model", "m"}, {"reason", "anchor"}}, 0),
            1);
}

// Two daemons on one node (two pods, or one node answering twice) are one identity: beside
// them, no quorum; the disk loads, counted as reason "anchor".
TEST_F(NodeTokenFillTest, ServiceAccountTokenTwoHoldersBehindOneNodeCountOnce) {
  const uint16_t a1 = StartDaemon("a1", "node-a", {}, /*load=*/true);
  const uint16_t a2 = StartDaemon("a2", "node-a", {}, /*load=*/true);
  ASSERT_TRUE(a1 != 0 && a2 != 0);
  ASSERT_NE(StartDaemon("b", "node-b", {a1, a2}, false, PeerIdentity::kToken, &metrics_), 0);
  ASSERT_NE(Acquire("b"), nullptr);
  EXPECT_EQ(EntryOf("b").source(), "disk");
  EXPECT_EQ(Sample("weightcache_peer_fill_fallbacks_total", {{"model", "m"}, {"reason", "anchor"}}),
            1);
}

// A holder that presents no token (here: one running with certificate identities) counts for
// nothing, whatever its certificate says: beside one token holder, no quorum.
TEST_F(NodeTokenFillTest, ServiceAccountTokenAbsentCountsForNothing) {
  const uint16_t a = StartDaemon("a", "node-a", {}, /*load=*/true);
  const uint16_t c = StartDaemon("c", "node-c", {}, /*load=*/true, PeerIdentity::kCertificate);
  ASSERT_TRUE(a != 0 && c != 0);
  ASSERT_NE(StartDaemon("b", "node-b", {a, c}, false, PeerIdentity::kToken, &metrics_), 0);
  ASSERT_NE(Acquire("b"), nullptr);
  EXPECT_EQ(EntryOf("b").source(), "disk");
  EXPECT_EQ(Sample("weightcache_peer_fill_fallbacks_total", {{"model", "m"}, {"reason", "anchor"}}),
            1);
  EXPECT_EQ(api_server_->token_requests(), 1);
}

// The asker's node and nonce are checked before any token is asked for: a malformed one is
// refused naming the field.
TEST_F(NodeTokenFillTest, ServiceAccountTokenAskWithABadNonceRefusedNamingIt) {
  const uint16_t a = StartDaemon("a", "node-a", {}, /*load=*/true);
  ASSERT_NE(a, 0);
  auto tls = peer::ReadTls(tls_);
  ASSERT_TRUE(tls.ok());
  auto client = peer::PeerClient::Make("127.0.0.1:" + std::to_string(a), *tls);
  const std::string fp = leases_.at(0)->fingerprint();
  auto r = client->Describe(fp, std::chrono::seconds(10), false, nullptr, "node-b", "abc");
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()), ::testing::HasSubstr("nonce: a nonce of 3"));
  r = client->Describe(fp, std::chrono::seconds(10), false, nullptr, "Node/B", nodeid::NewNonce());
  EXPECT_THAT(std::string(r.status().message()), ::testing::HasSubstr("asker_node: 'Node/B'"));
  EXPECT_EQ(api_server_->token_requests(), 0);
  r = client->Describe(fp, std::chrono::seconds(10), false, nullptr, "node-b", nodeid::NewNonce());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->node_token().empty());
}

// Two forgers, each serving the same forged copy and relaying to an honest daemon (node-a,
// node-c) the asker's node and nonce, so each comes back with a fresh token of an honest node,
// made for node b and this very call. Were a token bound to the node and call only, the forged
// digests would have two verified nodes behind them, a quorum, and B would serve them (their
// record and bytes agree). The token also binds the answer it vouched for (the honest record),
// so neither relay counts: B reads the disk.
TEST_F(NodeTokenFillTest, ReplayOfAFreshTokenUnderAnotherAnswerCountsForNothing) {
  ForgersInFrontOfTwoHoldersCountForNothing(peer::testing::CorruptPeerOptions::TokenPlay::kRelay);
}

// Two forgers presenting tokens the honest daemons gave them earlier, on their own calls (asked
// as node b, so the tokens are even made for B): the nonce is not B's for this call. B reads
// the disk.
TEST_F(NodeTokenFillTest, ReplayOfATokenFromAnotherCallCountsForNothing) {
  ForgersInFrontOfTwoHoldersCountForNothing(peer::testing::CorruptPeerOptions::TokenPlay::kReplay);
}

}  // namespace
}  // namespace weightcache::server
