// Node identity by tokens the API server signs (issue 57): a TokenRequest from a daemon's pod,
// verified against the issuer's keys, both against a test-played API server
// (testing/fake_api_server.h), and each way a node could pass off a token that does not prove it
// for this call: another node's, an expired or not yet valid one, one replayed from another call,
// one for another audience, another issuer's, another service account's, one signed with a key
// the issuer does not publish, "alg: none".
#include "pkg/nodeid/service_account_token.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>

#include "absl/strings/match.h"
#include "pkg/nodeid/kube_api.h"
#include "pkg/nodeid/node_identity.h"
#include "pkg/nodeid/testing/fake_api_server.h"
#include "tests/testutil/temp_dir.h"

namespace weightcache::nodeid {
namespace {

using testing::FakeApiServer;
using testing::FakePod;
using ::testing::HasSubstr;

int64_t Now() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

class TokenTest : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    auto s = FakeApiServer::Start(dir_.path(), {.alg = GetParam()});
    ASSERT_TRUE(s.ok()) << s.status();
    api_server_ = *std::move(s);
    // Two daemon pods, on nodes a and b; the verifier is node a's.
    a_ = {.name = "wc-a", .uid = "uid-a", .node = "node-a", .node_uid = "nuid-a"};
    b_ = {.name = "wc-b", .uid = "uid-b", .node = "node-b", .node_uid = "nuid-b"};
    for (const FakePod* p : {&a_, &b_}) {
      auto o = api_server_->AddPod(*p);
      ASSERT_TRUE(o.ok()) << o.status();
      auto api = KubeApi::Make(*o);
      ASSERT_TRUE(api.ok()) << api.status();
      apis_.push_back(*std::move(api));
    }
    EXPECT_EQ(apis_[0]->namespace_name(), "weightcache");
    EXPECT_EQ(apis_[0]->service_account(), "weightcache");
    auto v = ApiTokenVerifier::Make(
        apis_[0], {.namespace_name = "weightcache", .service_account = "weightcache"});
    ASSERT_TRUE(v.ok()) << v.status();
    verifier_ = *std::move(v);
  }

  // A token node b's daemon gets from the API server for `audience`.
  std::string TokenOfB(const std::string& audience) {
    auto src = ApiTokenSource::Make(apis_[1], {b_.name, b_.uid});
    EXPECT_TRUE(src.ok()) << src.status();
    auto t = (*src)->Token(audience);
    EXPECT_TRUE(t.ok()) << t.status();
    return t.ok() ? *t : "";
  }

  weightcache::testing::TempDir dir_;
  std::unique_ptr<FakeApiServer> api_server_;
  FakePod a_, b_;
  std::vector<std::shared_ptr<const KubeApi>> apis_;
  std::unique_ptr<ApiTokenVerifier> verifier_;
  const std::string nonce_ = NewNonce();
  const std::string claim_ = ClaimOf("the answer");
};

INSTANTIATE_TEST_SUITE_P(Algorithms, TokenTest, ::testing::Values("ES256", "RS256"));

TEST_P(TokenTest, ServiceAccountTokenProvesThePodsNode) {
  const std::string aud = PeerAudience("node-a", nonce_, claim_);
  auto v = verifier_->Verify(TokenOfB(aud), aud);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->node, "node-b");
  EXPECT_EQ(v->node_uid, "nuid-b");
  EXPECT_EQ(v->pod, "wc-b");
  EXPECT_EQ(v->pod_uid, "uid-b");
  EXPECT_EQ(api_server_->token_requests(), 1);
  // The keys are fetched once and kept.
  ASSERT_TRUE(verifier_->Verify(TokenOfB(aud), aud).ok());
  EXPECT_EQ(api_server_->key_fetches(), 1);
}

TEST_P(TokenTest, ServiceAccountTokenOfAnotherNodeRefused) {
  // Node b holds a token made for node c's call (c forwards what b gave it, or b kept one):
  // presented to node a, its audience names another node.
  const std::string for_c = TokenOfB(PeerAudience("node-c", nonce_, claim_));
  auto v = verifier_->Verify(for_c, PeerAudience("node-a", nonce_, claim_));
  EXPECT_EQ(v.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(v.status().message()), HasSubstr("weightcache.io/peer/node-c/"));
  EXPECT_THAT(std::string(v.status().message()), HasSubstr("not this node's call"));
}

TEST_P(TokenTest, ReplayOnAnotherCallRefused) {
  const std::string old = TokenOfB(PeerAudience("node-a", nonce_, claim_));
  auto v = verifier_->Verify(old, PeerAudience("node-a", NewNonce(), claim_));
  EXPECT_EQ(v.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(v.status().message()), HasSubstr("not this node's call"));
}

TEST_P(TokenTest, ReplayUnderAnotherAnswerRefused) {
  // A relay that keeps b's genuine token but swaps the answer it vouched for.
  const std::string t = TokenOfB(PeerAudience("node-a", nonce_, claim_));
  auto v = verifier_->Verify(t, PeerAudience("node-a", nonce_, ClaimOf("forged answer")));
  EXPECT_EQ(v.status().code(), absl::StatusCode::kPermissionDenied);
}

TEST_P(TokenTest, ServiceAccountTokenForAnotherAudienceRefused) {
  const std::string t = TokenOfB("https://kubernetes.default.svc");
  auto v = verifier_->Verify(t, PeerAudience("node-a", nonce_, claim_));
  EXPECT_EQ(v.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(v.status().message()), HasSubstr("https://kubernetes.default.svc"));
}

TEST_P(TokenTest, ShortLivedTokenExpiredRefused) {
  const std::string aud = PeerAudience("node-a", nonce_, claim_);
  const std::string t = api_server_->Sign(api_server_->ClaimsFor(b_, aud, Now() - 700));
  auto v = verifier_->Verify(t, aud);
  EXPECT_EQ(v.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(v.status().message()), HasSubstr("expired"));
}

TEST_P(TokenTest, ShortLivedTokenNotYetValidRefused) {
  const std::string aud = PeerAudience("node-a", nonce_, claim_);
  const std::string t = api_server_->Sign(api_server_->ClaimsFor(b_, aud, Now() + 600));
  auto v = verifier_->Verify(t, aud);
  EXPECT_EQ(v.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(v.status().message()), HasSubstr("nbf"));
}

TEST_P(TokenTest, ServiceAccountTokenWithBadSignatureRefused) {
  const std::string aud = PeerAudience("node-a", nonce_, claim_);
  // Signed with a key the issuer does not publish, under the published kid.
  const std::string t =
      api_server_->Sign(api_server_->ClaimsFor(b_, aud, Now()), /*unknown_key=*/true);
  auto v = verifier_->Verify(t, aud);
  EXPECT_EQ(v.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(v.status().message()), HasSubstr("does not verify"));
  // A genuine token whose payload was changed (another node) fails too.
  std::string genuine = TokenOfB(aud);
  auto forged_claims = api_server_->ClaimsFor(a_, aud, Now());
  const size_t d1 = genuine.find('.');
  const size_t d2 = genuine.rfind('.');
  std::string forged =
      genuine.substr(0, d1 + 1) + Base64UrlEncode(forged_claims.dump()) + genuine.substr(d2);
  v = verifier_->Verify(forged, aud);
  EXPECT_EQ(v.status().code(), absl::StatusCode::kPermissionDenied);
}

TEST_P(TokenTest, ServiceAccountTokenOfUnknownKeyRefused) {
  const std::string aud = PeerAudience("node-a", nonce_, claim_);
  const std::string t =
      api_server_->Sign(api_server_->ClaimsFor(b_, aud, Now()), /*unknown_key=*/true, "made-up");
  auto v = verifier_->Verify(t, aud);
  EXPECT_EQ(v.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(v.status().message()), HasSubstr("'made-up'"));
  // An unknown kid refetches the keys, but not again within the refetch interval.
  v = verifier_->Verify(t, aud);
  EXPECT_EQ(v.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(api_server_->key_fetches(), 1);
}

TEST_P(TokenTest, ServiceAccountTokenOfAnotherIssuerRefused) {
  const std::string aud = PeerAudience("node-a", nonce_, claim_);
  auto c = api_server_->ClaimsFor(b_, aud, Now());
  c["iss"] = "https://elsewhere.example";
  auto v = verifier_->Verify(api_server_->Sign(c), aud);
  EXPECT_EQ(v.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(v.status().message()), HasSubstr("issuer 'https://elsewhere.example'"));
}

TEST_P(TokenTest, ServiceAccountTokenOfAnotherServiceAccountRefused) {
  // Any workload of the cluster can get a token naming its own node: only the daemons'
  // service account proves a daemon.
  const std::string aud = PeerAudience("node-a", nonce_, claim_);
  FakePod other = b_;
  other.service_account = "default";
  auto v = verifier_->Verify(api_server_->Sign(api_server_->ClaimsFor(other, aud, Now())), aud);
  EXPECT_EQ(v.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(v.status().message()),
              HasSubstr("system:serviceaccount:weightcache:default"));
  other = b_;
  other.namespace_name = "team-a";
  v = verifier_->Verify(api_server_->Sign(api_server_->ClaimsFor(other, aud, Now())), aud);
  EXPECT_EQ(v.status().code(), absl::StatusCode::kPermissionDenied);
}

TEST_P(TokenTest, ServiceAccountTokenWithoutNodeOrPodRefused) {
  const std::string aud = PeerAudience("node-a", nonce_, claim_);
  auto c = api_server_->ClaimsFor(b_, aud, Now());
  c["kubernetes.io"].erase("node");
  auto v = verifier_->Verify(api_server_->Sign(c), aud);
  EXPECT_THAT(std::string(v.status().message()), HasSubstr("names no node"));
  c = api_server_->ClaimsFor(b_, aud, Now());
  c["kubernetes.io"].erase("pod");
  v = verifier_->Verify(api_server_->Sign(c), aud);
  EXPECT_THAT(std::string(v.status().message()), HasSubstr("not bound to a pod"));
}

TEST_P(TokenTest, ServiceAccountTokenWithAlgNoneRefused) {
  const std::string aud = PeerAudience("node-a", nonce_, claim_);
  const nlohmann::json header = {{"alg", "none"}};
  const std::string t = Base64UrlEncode(header.dump()) + "." +
                        Base64UrlEncode(api_server_->ClaimsFor(b_, aud, Now()).dump()) + ".";
  auto v = verifier_->Verify(t, aud);
  EXPECT_EQ(v.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(v.status().message()), HasSubstr("alg 'none'"));
  v = verifier_->Verify("not a token", aud);
  EXPECT_THAT(std::string(v.status().message()), HasSubstr("1 dot-separated parts"));
  v = verifier_->Verify(std::string(1 << 20, 'a'), aud);
  EXPECT_THAT(std::string(v.status().message()), HasSubstr("1048576 bytes (at most 16384)"));
  // A lifetime that is not an integer number of seconds is no lifetime.
  auto c = api_server_->ClaimsFor(b_, aud, Now());
  c["exp"] = 1e300;
  v = verifier_->Verify(api_server_->Sign(c), aud);
  EXPECT_THAT(std::string(v.status().message()), HasSubstr("no expiry"));
}

TEST_P(TokenTest, TokenRequestForAnotherPodRefused) {
  // The API server (with the chart's admission policy) binds a token to the asking pod only.
  auto src = ApiTokenSource::Make(apis_[1], {a_.name, a_.uid});
  ASSERT_TRUE(src.ok());
  auto t = (*src)->Token(PeerAudience("node-a", nonce_, claim_));
  EXPECT_EQ(t.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(t.status().message()), HasSubstr("HTTP 403"));
}

TEST(KubeApiTest, MissingCredentialsNamed) {
  weightcache::testing::TempDir dir;
  KubeApiOptions o;
  o.server = "127.0.0.1:1";
  o.token_file = dir / "token";
  o.ca_file = dir / "ca.crt";
  o.namespace_file = dir / "namespace";
  auto api = KubeApi::Make(o);
  EXPECT_EQ(api.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(api.status().message()), HasSubstr(o.ca_file));
  o.server = "";
  ::unsetenv("KUBERNETES_SERVICE_HOST");
  api = KubeApi::Make(o);
  EXPECT_THAT(std::string(api.status().message()), HasSubstr("KUBERNETES_SERVICE_HOST"));
  o.server = "127.0.0.1";
  api = KubeApi::Make(o);
  EXPECT_THAT(std::string(api.status().message()), HasSubstr("not host:port"));
}

TEST(KubeApiTest, ServerNotSignedByTheClusterCaRefused) {
  weightcache::testing::TempDir dir, other;
  auto s = FakeApiServer::Start(dir.path(), {});
  ASSERT_TRUE(s.ok()) << s.status();
  auto o = (*s)->AddPod({.name = "wc-a", .uid = "uid-a", .node = "node-a", .node_uid = "n"});
  ASSERT_TRUE(o.ok());
  auto t = FakeApiServer::Start(other.path(), {});  // another CA
  ASSERT_TRUE(t.ok());
  o->ca_file = other / "tls.crt";
  auto api = KubeApi::Make(*o);
  ASSERT_TRUE(api.ok()) << api.status();
  auto j = (*api)->Get("/openid/v1/jwks");
  EXPECT_EQ(j.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(j.status().message()), HasSubstr("not signed by the cluster CA"));
}

TEST(NodeIdentityTest, BadNamesAndNoncesNamed) {
  EXPECT_TRUE(CheckNodeName("node-a.example", "node").ok());
  EXPECT_THAT(std::string(CheckNodeName("Node/A", "--node_name").message()),
              HasSubstr("--node_name: 'Node/A' is not a node name"));
  EXPECT_THAT(std::string(CheckNodeName("", "--node_name").message()), HasSubstr("0 characters"));
  EXPECT_TRUE(CheckNonce(NewNonce(), "nonce").ok());
  EXPECT_THAT(std::string(CheckNonce("abc", "nonce").message()), HasSubstr("3 characters"));
  EXPECT_FALSE(CheckNonce(std::string(32, 'G'), "nonce").ok());
}

}  // namespace
}  // namespace weightcache::nodeid
