// Which holders a peer fill believes (issue 48): pinned digests over any holder count, a quorum
// of distinct certificate names, a lone or same-named holder only with --peer_trust=single.
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

}  // namespace
}  // namespace weightcache::server
