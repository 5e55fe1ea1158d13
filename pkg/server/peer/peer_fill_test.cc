// Peer fill (issue 30) in process: daemons on the host backend (segments of 64 KiB, so the
// small checkpoint is several segments) serving the peer API on loopback TCP with mutual
// TLS, UCX over TCP. A cold daemon with --peers fills "m" from a holder: the entry is
// "peer_fill" with no checkpoint byte read by its load, and its segments equal the holder's,
// which came from disk. No holder, or a holder serving a corrupted segment: the load reads
// from disk and counts the fallback by reason; a fill that kept some segments reads only the
// others from disk. Through PeerFill itself: segments striped over
// two sources, and a source gone after it answered leaves its segments to the other.
#include "pkg/server/peer/peer_fill.h"

#include <fcntl.h>
#include <prometheus/registry.h>

#include <cstring>
#include <map>
#include <optional>

#include "absl/strings/escaping.h"
#include "gtest/gtest.h"
#include "pkg/integrity/segment_digest.h"
#include "pkg/memory/mapping.h"
#include "pkg/metrics/metrics.h"
#include "pkg/peer/client.h"
#include "pkg/peer/testing/corrupt_peer.h"
#include "pkg/peer/testing/test_ca.h"
#include "pkg/server/testing/in_process_daemon.h"
#include "pkg/server/testing/metric_sample.h"
#include "pkg/util/scoped_fd.h"

namespace weightcache::server {
namespace {

constexpr uint64_t kSegmentBytes = 64 << 10;

class PeerFillTest : public testing::DaemonInProcessTest {
 protected:
  void SetUp() override {
    ::setenv("UCX_TLS", "tcp", 1);
    DaemonInProcessTest::SetUp();
    memory::HostBackendOptions bo;
    bo.max_segment_bytes = kSegmentBytes;
    backend_ = memory::MakeHostBackend(bo);
    auto ca = peer::testing::TestCa::Create(dir_.path(), "fleet");
    ASSERT_TRUE(ca.ok()) << ca.status();
    ca_ = *ca;
    auto a = ca->Issue("node-a", peer::kDefaultServerName);
    auto b = ca->Issue("node-b", peer::kDefaultServerName);
    ASSERT_TRUE(a.ok() && b.ok());
    a_files_ = {a->cert_file, a->key_file, ca->ca_file()};
    b_files_ = {b->cert_file, b->key_file, ca->ca_file()};
    auto tls = peer::ReadTls(b_files_);
    ASSERT_TRUE(tls.ok()) << tls.status();
    b_tls_ = *tls;
  }
  void TearDown() override {
    held_.clear();
    clients_.clear();
    others_.clear();
    ::unsetenv("UCX_TLS");
  }
  // A: the fixture's daemon, serving the peer API; `load`: holds "m" ready.
  void StartA(bool load) {
    DaemonOptions o;
    o.peer.listen = "127.0.0.1:0";
    o.peer.tls = a_files_;
    o.preload = load;
    Start(std::move(o));
    if (load) {
      auto lease = Acquire();
      ASSERT_TRUE(lease.ok()) << lease.status();
      fingerprint_ = (*lease)->fingerprint();
      a_lease_ = *std::move(lease);
    }
    port_a_ = static_cast<uint16_t>(daemon_->peer_port());
  }
  // Another daemon knowing "m" on socket dir `name`, asking `peers` (none: no peer fill),
  // serving the peer API; with `load`, it loads "m" from disk first.
  Daemon* StartOther(const std::string& name, std::vector<peer::PeerName> peers, bool load,
                     metrics::Metrics* m = nullptr) {
    DaemonOptions o = OtherDaemonOptions(name, load);
    o.specs[0].digests = file_digests_;
    o.specs[0].segment_digests = segment_digests_;
    o.peer.listen = "127.0.0.1:0";
    o.peer.tls = b_files_;
    o.peer.trust = trust_;
    o.peer.peers = std::move(peers);
    o.peer.describe_timeout = std::chrono::seconds(10);
    o.metrics = m;
    auto d = Daemon::Start(std::move(o), backend_.get());
    EXPECT_TRUE(d.ok()) << d.status();
    if (!d.ok()) return nullptr;
    others_.push_back(std::move(d).value());
    auto c = client::Client::Connect(dir_ / name);
    EXPECT_TRUE(c.ok()) << c.status();
    if (!c.ok()) return nullptr;
    clients_[name] = std::move(c).value();
    if (load) {
      auto lease = AcquireFrom(name);
      EXPECT_TRUE(lease.ok()) << lease.status();
    }
    return others_.back().get();
  }
  absl::StatusOr<std::unique_ptr<client::Lease>> AcquireFrom(const std::string& name) {
    client::AcquireOptions o;
    o.model = "m";
    o.wait_ready = true;
    o.load_on_miss = true;
    o.timeout = std::chrono::seconds(60);
    return clients_.at(name)->Acquire(o);
  }
  // Starts daemon `name` asking `peers`, acquires "m" there (filled or loaded), checks its
  // bytes are A's and returns its entry. The lease stays held.
  v1::EntryInfo AcquireOnNew(const std::string& name, std::vector<peer::PeerName> peers,
                             metrics::Metrics* m = nullptr) {
    if (StartOther(name, std::move(peers), false, m) == nullptr) return {};
    auto lease = AcquireFrom(name);
    EXPECT_TRUE(lease.ok()) << lease.status();
    if (!lease.ok()) return {};
    ExpectSameBytesAsA(**lease);
    held_.push_back(*std::move(lease));
    return EntryOf(name);
  }
  // The entry of "m" as `name`'s daemon reports it.
  v1::EntryInfo EntryOf(const std::string& name) {
    auto st = clients_.at(name)->Status();
    EXPECT_TRUE(st.ok()) << st.status();
    for (const auto& e : st->entries()) {
      if (e.model() == "m") return e;
    }
    ADD_FAILURE() << "no entry of m at " << name;
    return {};
  }
  // Every segment of `lease` equals A's (which A read from the checkpoint).
  void ExpectSameBytesAsA(const client::Lease& lease) {
    ASSERT_TRUE(a_lease_ != nullptr);
    ASSERT_EQ(lease.fingerprint(), a_lease_->fingerprint());
    ASSERT_EQ(lease.segment_count(), a_lease_->segment_count());
    ASSERT_GT(lease.segment_count(), 2u);  // several segments: the striping has work to share
    for (size_t i = 0; i < lease.segment_count(); ++i) {
      ASSERT_EQ(lease.segment_size(i), a_lease_->segment_size(i)) << "segment " << i;
      EXPECT_EQ(
          std::memcmp(lease.segment_base(i), a_lease_->segment_base(i), lease.segment_size(i)), 0)
          << "segment " << i;
    }
  }
  double Sample(const std::string& name, const std::map<std::string, std::string>& labels) {
    return testing::Sample(registry_, name, labels, 0);
  }
  PeerFillOptions FillOptions(std::vector<peer::PeerName> peers,
                              PeerTrust trust = PeerTrust::kQuorum) {
    PeerFillOptions o;
    o.trust = trust;
    o.peers.peers = std::move(peers);
    o.peers.tls = b_tls_;
    o.peers.describe_timeout = std::chrono::seconds(10);
    return o;
  }
  // What the daemons StartOther starts believe, and their spec's pins (issue 48).
  PeerTrust trust_ = PeerTrust::kQuorum;
  std::optional<peer::testing::TestCa> ca_;  // the fleet's
  std::map<std::string, std::string> file_digests_;
  std::map<std::string, std::vector<std::string>> segment_digests_;
  peer::TlsFiles a_files_, b_files_;
  peer::TlsMaterial b_tls_;
  std::string fingerprint_;
  uint16_t port_a_ = 0;
  std::unique_ptr<client::Lease> a_lease_;
  prometheus::Registry registry_;
  metrics::Metrics metrics_{registry_, {}};
  std::vector<std::unique_ptr<Daemon>> others_;
  std::map<std::string, std::unique_ptr<client::Client>> clients_;
  std::vector<std::unique_ptr<client::Lease>> held_;
};

TEST_F(PeerFillTest, AColdDaemonFillsFromAHolderWithoutReadingTheCheckpoint) {
  trust_ = PeerTrust::kSingle;  // one holder (issue 48: by default one is not enough)
  StartA(/*load=*/true);
  ASSERT_NE(StartOther("b", {{"127.0.0.1", port_a_}}, false, &metrics_), nullptr);
  auto lease = AcquireFrom("b");
  ASSERT_TRUE(lease.ok()) << lease.status();
  ExpectSameBytesAsA(**lease);
  const v1::EntryInfo e = EntryOf("b");
  EXPECT_EQ(e.source(), "peer_fill");
  EXPECT_EQ(e.bytes_read(), 0u);  // no checkpoint byte read by the load
  EXPECT_EQ(Sample("weightcache_peer_fill_seconds", {{"model", "m"}}), 1);
  EXPECT_EQ(Sample("weightcache_peer_fill_bytes_total", {{"model", "m"}}),
            static_cast<double>(e.bytes()));
  EXPECT_EQ(Sample("weightcache_peer_fill_fallbacks_total", {{"model", "m"}}), 0);
  EXPECT_EQ(Sample("weightcache_peer_fill_anchor_total", {{"model", "m"}, {"anchor", "single"}}),
            1);
  // What B filled, B serves onward: a third daemon fills from B alone.
  ASSERT_NE(StartOther("c", {{"127.0.0.1", static_cast<uint16_t>(others_[0]->peer_port())}}, false),
            nullptr);
  auto from_b = AcquireFrom("c");
  ASSERT_TRUE(from_b.ok()) << from_b.status();
  ExpectSameBytesAsA(**from_b);
  EXPECT_EQ(EntryOf("c").source(), "peer_fill");
}

TEST_F(PeerFillTest, NoHolderMeansADiskLoadCountedAsNotHeld) {
  StartA(/*load=*/false);  // serves the peer API, holds nothing
  ASSERT_NE(StartOther("b", {{"127.0.0.1", port_a_}}, false, &metrics_), nullptr);
  auto lease = AcquireFrom("b");
  ASSERT_TRUE(lease.ok()) << lease.status();
  const v1::EntryInfo e = EntryOf("b");
  EXPECT_EQ(e.source(), "disk");
  EXPECT_GT(e.bytes_read(), 0u);
  EXPECT_EQ(
      Sample("weightcache_peer_fill_fallbacks_total", {{"model", "m"}, {"reason", "not_held"}}), 1);
  EXPECT_EQ(Sample("weightcache_peer_fill_seconds", {{"model", "m"}}), 0);
}

// The bytes A's own load read from the checkpoint (all of it: A loaded from disk).
uint64_t BytesReadByA(client::Client& a) {
  auto st = a.Status();
  EXPECT_TRUE(st.ok()) << st.status();
  if (!st.ok()) return 0;
  for (const auto& e : st->entries()) {
    if (e.model() == "m") return e.bytes_read();
  }
  ADD_FAILURE() << "A holds no entry of m";
  return 0;
}

TEST_F(PeerFillTest, ASourceServingACorruptedSegmentIsCaughtAndOnlyTheRestIsReadFromDisk) {
  trust_ = PeerTrust::kSingle;  // its own record is believed; its bytes are not
  StartA(/*load=*/true);
  peer::testing::CorruptPeerOptions co;
  co.server_files = a_files_;
  co.client_tls = b_tls_;
  co.honest_address = "127.0.0.1:" + std::to_string(port_a_);
  co.fingerprint = fingerprint_;
  co.bad_segment = 2;
  auto bad = peer::testing::CorruptPeer::Start(co);
  ASSERT_TRUE(bad.ok()) << bad.status();
  // B knows only the corrupt peer.
  ASSERT_NE(
      StartOther("b", {{"127.0.0.1", static_cast<uint16_t>((*bad)->port())}}, false, &metrics_),
      nullptr);
  auto lease = AcquireFrom("b");
  ASSERT_TRUE(lease.ok()) << lease.status();
  ExpectSameBytesAsA(**lease);  // the checkpoint's bytes, not the corrupt copy
  const v1::EntryInfo e = EntryOf("b");
  EXPECT_EQ(e.state(), "ready");
  EXPECT_EQ(Sample("weightcache_peer_fill_fallbacks_total", {{"model", "m"}, {"reason", "digest"}}),
            1);
  EXPECT_EQ(Sample("weightcache_peer_fill_seconds", {{"model", "m"}}), 0);
  // One source, segments taken in order: 0 and 1 were filled and checked before segment 2's
  // digest dropped it. Those two stay; the disk gave the rest, and only the rest.
  const uint64_t whole = BytesReadByA(*client_);
  EXPECT_GT(e.bytes_read(), 0u);
  EXPECT_LT(e.bytes_read(), whole) << "B read the whole checkpoint again after its fill failed";
  const double from_peers = Sample("weightcache_peer_fill_bytes_total", {{"model", "m"}});
  EXPECT_EQ(from_peers, static_cast<double>((*lease)->segment_size(0) + (*lease)->segment_size(1)));
}

// Issue 48: one holder's record vouches only for itself. By default (quorum) a lone holder is
// not believed: the disk loads the rank, counted as reason "anchor". It used to be filled.
TEST_F(PeerFillTest, ALoneHoldersRecordIsNotBelievedByDefault) {
  StartA(/*load=*/true);
  const v1::EntryInfo e = AcquireOnNew("b", {{"127.0.0.1", port_a_}}, &metrics_);
  EXPECT_EQ(e.source(), "disk");
  EXPECT_GT(e.bytes_read(), 0u);
  EXPECT_EQ(Sample("weightcache_peer_fill_fallbacks_total", {{"model", "m"}, {"reason", "anchor"}}),
            1);
  EXPECT_EQ(Sample("weightcache_peer_fill_seconds", {{"model", "m"}}), 0);
}

// A compromised holder: it answers Describe with a self-consistent forged record (the digest
// of the segment it altered) and serves the altered bytes, which match that record. Beside
// one honest holder nothing decides between them: the disk loads. Beside two honest holders
// with distinct certificate names, theirs is the quorum: the fill takes only their bytes,
// reading no checkpoint byte. Either way B never serves the forged bytes. Before issue 48, B
// believed whichever record it was given and served the forger's segment.
TEST_F(PeerFillTest, AForgedSelfConsistentHolderNeverGetsItsBytesServed) {
  StartA(/*load=*/true);
  peer::testing::CorruptPeerOptions co;
  co.client_tls = b_tls_;
  co.honest_address = "127.0.0.1:" + std::to_string(port_a_);
  co.fingerprint = fingerprint_;
  co.bad_segment = 1;
  co.forge_record = true;
  // A member of the fleet (the CA signed it) under its own certificate name.
  auto evil = ca_->Issue("node-evil", peer::kDefaultServerName);
  ASSERT_TRUE(evil.ok()) << evil.status();
  co.server_files = {evil->cert_file, evil->key_file, ca_->ca_file()};
  auto bad = peer::testing::CorruptPeer::Start(co);
  ASSERT_TRUE(bad.ok()) << bad.status();
  const peer::PeerName forger{"127.0.0.1", static_cast<uint16_t>((*bad)->port())};

  EXPECT_EQ(AcquireOnNew("b", {forger, {"127.0.0.1", port_a_}}, &metrics_).source(), "disk");
  EXPECT_EQ(Sample("weightcache_peer_fill_fallbacks_total", {{"model", "m"}, {"reason", "anchor"}}),
            1);

  // C holds "m" from disk under its own name (node-b); D asks the forger, A and C.
  Daemon* c = StartOther("c", {}, /*load=*/true);
  ASSERT_NE(c, nullptr);
  const peer::PeerName honest_c{"127.0.0.1", static_cast<uint16_t>(c->peer_port())};
  prometheus::Registry d_registry;
  metrics::Metrics d_metrics{d_registry, {}};
  const v1::EntryInfo d = AcquireOnNew("d", {forger, {"127.0.0.1", port_a_}, honest_c}, &d_metrics);
  EXPECT_EQ(d.source(), "peer_fill");
  EXPECT_EQ(d.bytes_read(), 0u);
  EXPECT_EQ(testing::Sample(d_registry, "weightcache_peer_fill_anchor_total",
                            {{"model", "m"}, {"anchor", "quorum"}}, 0),
            1);
}

// Pinned segment digests (the spec's, from `weightcachectl pin` on a node that loaded the
// model) are an anchor no holder controls: one honest holder suffices, a forger beside it is
// refused, and with the files' digests pinned too, a node with an empty digest store fills
// without reading or hashing a checkpoint byte.
TEST_F(PeerFillTest, PinnedSegmentDigestsLetOneHolderServeAndRefuseAForger) {
  StartA(/*load=*/true);
  // The pins, as A knows them: file SHA-256s from its Status, segment digests from its record.
  auto st = client_->Status();
  ASSERT_TRUE(st.ok()) << st.status();
  for (const auto& m : st->models()) {
    if (m.name() != "m") continue;
    for (const auto& f : m.files()) {
      ASSERT_EQ(f.digest().rfind("sha256:", 0), 0u) << f.digest();
      file_digests_[f.name()] = f.digest().substr(7);
    }
  }
  ASSERT_FALSE(file_digests_.empty());
  auto desc = peer::PeerClient::Make("127.0.0.1:" + std::to_string(port_a_), b_tls_)
                  ->Describe(fingerprint_, std::chrono::seconds(10));
  ASSERT_TRUE(desc.ok()) << desc.status();
  auto rec = DecodeKeeperRecord(desc->record());
  ASSERT_TRUE(rec.ok()) << rec.status();
  for (const auto& d : rec->record.segment_sha256()) {
    segment_digests_[fingerprint_].push_back(absl::BytesToHexString(d));
  }
  peer::testing::CorruptPeerOptions co;
  co.server_files = a_files_;
  co.client_tls = b_tls_;
  co.honest_address = "127.0.0.1:" + std::to_string(port_a_);
  co.fingerprint = fingerprint_;
  co.bad_segment = 0;
  co.forge_record = true;
  auto bad = peer::testing::CorruptPeer::Start(co);
  ASSERT_TRUE(bad.ok()) << bad.status();
  const v1::EntryInfo e = AcquireOnNew(
      "b", {{"127.0.0.1", static_cast<uint16_t>((*bad)->port())}, {"127.0.0.1", port_a_}},
      &metrics_);
  EXPECT_EQ(e.source(), "peer_fill");
  EXPECT_EQ(e.bytes_read(), 0u);
  auto b_status = clients_.at("b")->Status();
  ASSERT_TRUE(b_status.ok());
  EXPECT_EQ(b_status->hashed_bytes(), 0u);  // the fingerprint came from the pins
  EXPECT_EQ(Sample("weightcache_peer_fill_anchor_total", {{"model", "m"}, {"anchor", "pinned"}}),
            1);
}

// Through PeerFill: two holders share the segments; one gone after answering leaves its
// segments to the other; all gone is a failure naming the reason.
class PeerFillStripingTest : public PeerFillTest {
 protected:
  void SetUp() override {
    PeerFillTest::SetUp();
    StartA(/*load=*/true);
    Daemon* c = StartOther("c", {}, /*load=*/true);
    ASSERT_NE(c, nullptr);
    port_c_ = static_cast<uint16_t>(c->peer_port());
    // The plan both holders used: A's record's.
    PeerFill probe(FillOptions({{"127.0.0.1", port_a_}}), backend_.get(), nullptr);
    FillFailure why{FillFallback::kNotHeld, absl::OkStatus()};
    load::Plan any;
    auto found = probe.Find(fingerprint_, any, {}, &why);
    ASSERT_TRUE(found.empty());  // an empty plan is not A's: refused by placement
    ASSERT_EQ(why.reason, FillFallback::kRecord) << why.status;
    EXPECT_NE(why.status.message().find("placed otherwise"), std::string::npos) << why.status;
    // Decode A's record for the real plan.
    auto desc = peer::PeerClient::Make("127.0.0.1:" + std::to_string(port_a_), b_tls_)
                    ->Describe(fingerprint_, std::chrono::seconds(10));
    ASSERT_TRUE(desc.ok()) << desc.status();
    auto rec = DecodeKeeperRecord(desc->record());
    ASSERT_TRUE(rec.ok()) << rec.status();
    plan_ = rec->plan;
  }
  std::unique_ptr<load::LoadedModel> ExpectFilled(PeerFill& fill,
                                                  const std::vector<FillSource>& sources,
                                                  FillReport* report) {
    load::LoadProgress progress;
    FillFailure why{FillFallback::kNotHeld, absl::OkStatus()};
    auto m =
        fill.Fill(sources, plan_, "m", dir_ / "m", "host", "test/fill", &progress, &why, report);
    EXPECT_TRUE(m.ok()) << m.status();
    if (!m.ok()) return nullptr;
    EXPECT_EQ(progress.done(), progress.total());
    // Sealed segments are read through a read-only mapping, as engines read them.
    std::vector<ScopedFd> fds;
    std::vector<uint64_t> sizes;
    for (const auto& seg : (*m)->segments) {
      fds.emplace_back(::fcntl(seg->fd(), F_DUPFD_CLOEXEC, 0));
      sizes.push_back(seg->size());
    }
    auto map = memory::MapReadOnly(memory::BackendKind::kHost, std::move(fds), sizes, "host");
    EXPECT_TRUE(map.ok()) << map.status();
    if (!map.ok()) return nullptr;
    EXPECT_EQ(sizes.size(), a_lease_->segment_count());
    for (size_t i = 0; i < sizes.size() && i < a_lease_->segment_count(); ++i) {
      EXPECT_EQ(sizes[i], a_lease_->segment_size(i));
      if (sizes[i] != a_lease_->segment_size(i)) continue;
      EXPECT_EQ(std::memcmp((*map)->base(i), a_lease_->segment_base(i), sizes[i]), 0)
          << "segment " << i;
    }
    return std::move(m).value();
  }
  // Fills the rank from both holders (A and C); null (a failure recorded) when it is not.
  std::unique_ptr<load::LoadedModel> FillFromBoth(FillReport* report) {
    PeerFill fill(FillOptions({{"127.0.0.1", port_a_}, {"127.0.0.1", port_c_}}), backend_.get(),
                  nullptr);
    FillFailure why{FillFallback::kNotHeld, absl::OkStatus()};
    auto sources = fill.Find(fingerprint_, plan_, {}, &why);
    EXPECT_EQ(sources.size(), 2u) << why.status;
    if (sources.size() != 2) return nullptr;
    return ExpectFilled(fill, sources, report);
  }
  uint16_t port_c_ = 0;
  load::Plan plan_;
};

TEST_F(PeerFillStripingTest, SegmentsAreStripedOverTwoHolders) {
  FillReport report;
  auto m = FillFromBoth(&report);
  ASSERT_NE(m, nullptr);
  ASSERT_EQ(report.segments_by_source.size(), 2u);
  EXPECT_GT(report.segments_by_source[0], 0u);
  EXPECT_GT(report.segments_by_source[1], 0u);
  EXPECT_EQ(report.segments_by_source[0] + report.segments_by_source[1], m->segments.size());
}

// The digests each pulled segment's check took are the entry's: the report carries them,
// one per segment, equal to the registry digester's (DigestSegment, scrub and cryptographic)
// of the same sealed memory, so the registry need not pass over the bytes again.
TEST_F(PeerFillStripingTest, HashedOnceTheChecksDigestsAreTheSegmentsDigests) {
  FillReport report;
  auto m = FillFromBoth(&report);
  ASSERT_NE(m, nullptr);
  ASSERT_EQ(report.digests.size(), m->segments.size());
  for (size_t i = 0; i < m->segments.size(); ++i) {
    auto d = integrity::DigestSegment(memory::BackendKind::kHost, *m->segments[i], {},
                                      integrity::Want::kScrubAndCrypto);
    ASSERT_TRUE(d.ok()) << d.status();
    EXPECT_TRUE(report.digests[i] == *d) << "segment " << i;
    EXPECT_EQ(report.digests[i].sha256, report.sha256[i]) << "segment " << i;
  }
}

TEST_F(PeerFillStripingTest, AHolderGoneAfterAnsweringLeavesItsSegmentsToTheOther) {
  PeerFill fill(FillOptions({{"127.0.0.1", port_a_}, {"127.0.0.1", port_c_}}), backend_.get(),
                nullptr);
  FillFailure why{FillFallback::kNotHeld, absl::OkStatus()};
  auto sources = fill.Find(fingerprint_, plan_, {}, &why);
  ASSERT_EQ(sources.size(), 2u) << why.status;
  // C goes away (its exposures and UCX worker with it) between the answer and the pulls.
  others_.clear();
  clients_.erase("c");
  FillReport report;
  auto m = ExpectFilled(fill, sources, &report);
  ASSERT_NE(m, nullptr);
  const size_t c_index = sources[0].address.ends_with(std::to_string(port_c_)) ? 0 : 1;
  EXPECT_EQ(report.segments_by_source[c_index], 0u);
  EXPECT_EQ(report.segments_by_source[1 - c_index], m->segments.size());
}

TEST_F(PeerFillStripingTest, EveryHolderGoneIsAFailureNamingTheTransfer) {
  PeerFill fill(FillOptions({{"127.0.0.1", port_c_}}, PeerTrust::kSingle), backend_.get(), nullptr);
  FillFailure why{FillFallback::kNotHeld, absl::OkStatus()};
  auto sources = fill.Find(fingerprint_, plan_, {}, &why);
  ASSERT_EQ(sources.size(), 1u) << why.status;
  others_.clear();
  clients_.erase("c");
  load::LoadProgress progress;
  auto m = fill.Fill(sources, plan_, "m", dir_ / "m", "host", "test/fill", &progress, &why);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(why.reason, FillFallback::kTransfer) << why.status;
  EXPECT_NE(m.status().message().find("every source was dropped"), std::string::npos) << m.status();
}

}  // namespace
}  // namespace weightcache::server
