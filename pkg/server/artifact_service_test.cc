// The artifact RPCs' service on its own (artifacts.h): a real store, catalog and access, no
// daemon, no sockets. Who may put, get and evict; the key a private model's artifact goes
// under; the token's handle socket; each result counted.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "pkg/metrics/metrics.h"
#include "pkg/server/internal/artifacts.h"
#include "pkg/server/testing/core_parts.h"
#include "pkg/server/testing/metric_sample.h"
#include "prometheus/registry.h"

namespace weightcache::server {
namespace {

using ::testing::HasSubstr;

constexpr uid_t kPublisher = 1000;
using testing::kAdmin;
constexpr uid_t kEngine = 0;

using testing::On;
using testing::Spec;

v1::ArtifactKey Key(const std::string& model = "m") {
  v1::ArtifactKey k;
  k.set_kind("torch-compile");
  k.set_model(model);
  k.set_fingerprint("wc1-test");
  k.set_settings_hash("mode=default");
  return k;
}

class ArtifactServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    PolicyOptions po;
    po.admin_uids = {kAdmin};
    po.publish_uids = {kPublisher};
    access_ = std::make_unique<Access>(po, nullptr, models_, nullptr, 16, &metrics_);
    auto store = artifact::Store::Open({});
    ASSERT_TRUE(store.ok()) << store.status();
    service_ = std::make_unique<ArtifactService>(
        ArtifactService::Options{.handle_socket = "/run/wc/handle.sock",
                                 .slot_handle_socket = "/wc/handle.sock",
                                 .dir = "",
                                 .token_ttl = std::chrono::seconds(10)},
        std::move(store).value(), *access_, models_, &metrics_);
  }
  // A put of `bytes` in messages of at most `chunk` bytes.
  absl::Status Put(const Caller& who, const v1::ArtifactKey& key, const std::string& bytes,
                   v1::PutArtifactResponse* resp, size_t chunk = 5) {
    size_t at = 0;
    bool first = true;
    return service_->Put(
        who,
        [&](v1::PutArtifactRequest* m) {
          if (!first && at >= bytes.size()) return false;
          if (first) {
            *m->mutable_key() = key;
            m->set_size(bytes.size());
          }
          first = false;
          m->set_data(bytes.substr(at, chunk));
          at += chunk;
          return true;
        },
        resp);
  }
  double Artifacts(const std::string& op, const std::string& result) {
    return testing::Sample(registry_, "weightcache_artifact_requests_total",
                           {{"op", op}, {"result", result}}, 0);
  }

  ModelCatalog models_{{Spec("m"), Spec("a-only", {"team-a"})}, 1, {}, nullptr};
  prometheus::Registry registry_;
  metrics::Metrics metrics_{registry_, metrics::BuildInfo{"t", "none", "host"}};
  std::unique_ptr<Access> access_;
  std::unique_ptr<ArtifactService> service_;
};

TEST_F(ArtifactServiceTest, APublisherPutsAndAnEngineGetsATokenForTheSameBytes) {
  v1::PutArtifactResponse put;
  ASSERT_TRUE(Put(On(kPublisher), Key(), "compiled-graph-bytes", &put).ok());
  EXPECT_EQ(put.bytes(), 20u);
  EXPECT_EQ(Artifacts("put", "stored"), 1);

  v1::GetArtifactRequest req;
  *req.mutable_key() = Key();
  v1::GetArtifactResponse got;
  ASSERT_TRUE(service_->Get(On(kEngine), req, &got).ok());
  EXPECT_EQ(got.id(), put.id());
  EXPECT_EQ(got.sha256(), put.sha256());
  EXPECT_EQ(got.handle_socket(), "/run/wc/handle.sock");
  EXPECT_EQ(got.info().publisher().uid(), static_cast<int32_t>(kPublisher));
  EXPECT_EQ(Artifacts("get", "hit"), 1);

  // The token is claimable once, on the socket it was issued for.
  ASSERT_TRUE(service_->grants().IsToken(got.token()));
  EXPECT_EQ(service_->grants().Claim(got.token(), "weightcache-1").status().code(),
            absl::StatusCode::kPermissionDenied);
  auto grant = service_->grants().Claim(got.token(), "");
  ASSERT_TRUE(grant.ok()) << grant.status();
  EXPECT_EQ(grant->fds.size(), 1u);
  EXPECT_TRUE(ArtifactGrants::IsGrant(grant->lease_id));
  EXPECT_FALSE(service_->grants().IsToken(got.token()));
}

TEST_F(ArtifactServiceTest, AnEngineMayNotPutCodeAndAnUnknownModelHasNoArtifacts) {
  v1::PutArtifactResponse put;
  const absl::Status engine = Put(On(kEngine), Key(), "code", &put);
  EXPECT_EQ(engine.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(Artifacts("put", "refused"), 1);
  const absl::Status unknown = Put(On(kPublisher), Key("nope"), "code", &put);
  EXPECT_EQ(unknown.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(unknown.message()), HasSubstr("which this daemon does not know"));

  v1::GetArtifactRequest req;
  *req.mutable_key() = Key();
  v1::GetArtifactResponse got;
  EXPECT_EQ(service_->Get(On(kEngine), req, &got).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(Artifacts("get", "miss"), 1);
  v1::GetArtifactRequest keyless;
  EXPECT_EQ(service_->Get(On(kEngine), keyless, &got).code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(ArtifactServiceTest, OnlyAnAdminEvictsAndStatusShowsWhatRemains) {
  v1::PutArtifactResponse put;
  ASSERT_TRUE(Put(On(kPublisher), Key(), "graph", &put).ok());
  v1::EvictArtifactsRequest req;
  req.set_model("m");
  v1::EvictArtifactsResponse resp;
  EXPECT_EQ(service_->Evict(On(kEngine), req, &resp).code(), absl::StatusCode::kPermissionDenied);
  v1::StatusResponse before;
  service_->AppendStatus(On(kEngine), false, nullptr, &before);
  ASSERT_EQ(before.artifacts_size(), 1);
  EXPECT_EQ(before.artifacts(0).id(), put.id());
  EXPECT_EQ(before.artifact_usage().resident_bytes(), 5u);

  v1::EvictArtifactsRequest both;
  both.set_model("m");
  both.set_id(put.id());
  EXPECT_EQ(service_->Evict(On(kAdmin), both, &resp).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(service_->Evict(On(kAdmin), req, &resp).ok());
  EXPECT_EQ(resp.evicted(), 1u);
  v1::StatusResponse after;
  service_->AppendStatus(On(kEngine), false, nullptr, &after);
  EXPECT_EQ(after.artifacts_size(), 0);
  EXPECT_EQ(testing::Sample(registry_, "weightcache_artifact_resident_bytes"), 0);
}

TEST_F(ArtifactServiceTest, AFilteredStatusShowsOnlyTheModelsTheCallerMaySee) {
  v1::PutArtifactResponse put;
  ASSERT_TRUE(Put(On(kPublisher), Key("m"), "one", &put).ok());
  ASSERT_TRUE(Put(On(kPublisher), Key("a-only"), "two", &put).ok());
  v1::StatusResponse shown;
  service_->AppendStatus(
      On(kEngine), /*filtered=*/true, [](const std::string& model) { return model == "m"; },
      &shown);
  ASSERT_EQ(shown.artifacts_size(), 1);
  EXPECT_EQ(shown.artifacts(0).key().model(), "m");
}

}  // namespace
}  // namespace weightcache::server
