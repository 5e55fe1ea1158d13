// Which holders a peer fill believes (issue 48): pinned digests over any holder count, a quorum
// of distinct identities (verified nodes, issue 57, or certificate names), a lone or same-named
// holder only with --peer_trust=single; --peer_identity's values.
#include "pkg/server/peer/fill_anchor.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace weightcache::server {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

const std::vector<std::string> kTrue = {std::string(32, 't'), std::string(32, 'u')};
const std::vector<std::string> kForged = {std::string(32, 't'), std::string(32, 'f')};

TEST(FillAnchor, PinnedDigestsDecideWhateverTheHoldersSay) {
  // Two forgers agreeing outnumber the one honest holder: the pins still decide.
  const auto c = ChooseAnchor({{"evil-1", kForged}, {"node-a", kTrue}, {"evil-2", kForged}}, kTrue,
                              PeerTrust::kQuorum);
  EXPECT_EQ(c.anchor, "pinned");
  EXPECT_THAT(c.kept, ElementsAre(1u));
  ASSERT_EQ(c.refused.size(), 2u);
  EXPECT_THAT(c.refused[0].second, HasSubstr("not the spec's pinned ones"));
  const auto none = ChooseAnchor({{"evil-1", kForged}}, kTrue, PeerTrust::kSingle);
  EXPECT_TRUE(none.anchor.empty());
  EXPECT_THAT(std::string(none.none.message()), HasSubstr("pinned"));
}

TEST(FillAnchor, AQuorumNeedsDistinctNames) {
  const auto q = ChooseAnchor({{"node-a", kTrue}, {"evil", kForged}, {"node-b", kTrue}}, {},
                              PeerTrust::kQuorum);
  EXPECT_EQ(q.anchor, "quorum");
  EXPECT_THAT(q.kept, ElementsAre(0u, 2u));
  ASSERT_EQ(q.refused.size(), 1u);
  EXPECT_EQ(q.refused[0].first, 1u);
  // One name twice (a shared certificate, or one node answering on two addresses) is one.
  const auto same =
      ChooseAnchor({{"node-a", kForged}, {"node-a", kForged}}, {}, PeerTrust::kQuorum);
  EXPECT_TRUE(same.anchor.empty());
  EXPECT_THAT(std::string(same.none.message()), HasSubstr("at most 1 holder(s)"));
  // Nameless certificates count for nothing.
  EXPECT_TRUE(ChooseAnchor({{"", kTrue}, {"", kTrue}}, {}, PeerTrust::kQuorum).anchor.empty());
  // Two agreeing sets, each with a quorum: the fleet disagrees, nobody is believed.
  const auto split = ChooseAnchor({{"a", kTrue}, {"b", kTrue}, {"c", kForged}, {"d", kForged}}, {},
                                  PeerTrust::kSingle);
  EXPECT_TRUE(split.anchor.empty());
  EXPECT_THAT(std::string(split.none.message()), HasSubstr("disagrees"));
}

// A holder that filled from a peer vouches for nothing more than that peer did: one forger with
// trust single (or a forged pin) seeds a copy; the nodes that filled from it must not then form
// the quorum that lets the forgery spread as if independent nodes had read it from disk.
TEST(FillAnchor, LaunderedHoldersAreNotCountedInAQuorum) {
  const auto laundered = ChooseAnchor(
      {{"node-b", kForged, "peer_fill"}, {"node-c", kForged, "peer_fill"}}, {}, PeerTrust::kQuorum);
  EXPECT_TRUE(laundered.anchor.empty());
  EXPECT_THAT(std::string(laundered.none.message()),
              HasSubstr("2 not counted: filled from a peer"));
  // The same copy behind one disk holder and one filled: no quorum either.
  EXPECT_TRUE(ChooseAnchor({{"evil", kForged, "disk"}, {"node-b", kForged, "peer_fill"}}, {},
                           PeerTrust::kQuorum)
                  .anchor.empty());
  // A copy read from disk, and one pulled against pinned digests, both vouch; the laundered
  // holder still serves the agreed bytes (its digests match those of the quorum).
  const auto q = ChooseAnchor({{"node-a", kTrue, "disk"},
                               {"node-b", kTrue, "peer_fill_pinned"},
                               {"node-c", kTrue, "peer_fill"}},
                              {}, PeerTrust::kQuorum);
  EXPECT_EQ(q.anchor, "quorum");
  EXPECT_THAT(q.kept, ElementsAre(0u, 1u, 2u));
  // Adopted from the keeper, a copy keeps its origin (the record's): "keeper" is no origin.
  EXPECT_FALSE(OriginBacksAQuorum("keeper"));
  EXPECT_FALSE(OriginBacksAQuorum("publish"));
}

TEST(FillAnchor, OneHolderOnlyWhenTrustIsSingle) {
  EXPECT_TRUE(ChooseAnchor({{"node-a", kTrue}}, {}, PeerTrust::kQuorum).anchor.empty());
  const auto s = ChooseAnchor({{"node-a", kTrue}}, {}, PeerTrust::kSingle);
  EXPECT_EQ(s.anchor, "single");
  EXPECT_THAT(s.kept, ElementsAre(0u));
  EXPECT_EQ(ParsePeerTrust("quorum").value(), PeerTrust::kQuorum);
  EXPECT_EQ(ParsePeerTrust("single").value(), PeerTrust::kSingle);
  EXPECT_THAT(std::string(ParsePeerTrust("any").status().message()),
              HasSubstr("--peer_trust: 'any' is neither 'quorum' nor 'single'"));
}

// Issue 57: a holder whose token proved no node has no identity; the refusal says why.
TEST(FillAnchor, ServiceAccountTokenUnverifiedHoldersCountForNothing) {
  const auto c = ChooseAnchor({{"node-a", kTrue}, {"", kTrue, "disk", "token: expired 5 s ago"}},
                              {}, PeerTrust::kQuorum);
  EXPECT_TRUE(c.anchor.empty());
  EXPECT_THAT(std::string(c.none.message()),
              HasSubstr("1 not counted: no verified identity (token: expired 5 s ago)"));
}

TEST(FillAnchor, PeerIdentityValues) {
  EXPECT_EQ(*ParsePeerIdentity("token", false), PeerIdentity::kToken);
  EXPECT_EQ(*ParsePeerIdentity("certificate", true), PeerIdentity::kCertificate);
  EXPECT_EQ(*ParsePeerIdentity("auto", true), PeerIdentity::kToken);
  EXPECT_EQ(*ParsePeerIdentity("auto", false), PeerIdentity::kCertificate);
  const auto bad = ParsePeerIdentity("tokens", true);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("--peer_identity: 'tokens'"));
}

}  // namespace
}  // namespace weightcache::server
