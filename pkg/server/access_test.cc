// The door every RPC passes (access.h), on its own: a real catalog, policy and namespace
// rules (the kubelet's answer faked), no daemon, no sockets.
#include "pkg/server/internal/access.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "pkg/metrics/metrics.h"
#include "pkg/server/testing/core_parts.h"
#include "pkg/server/testing/metric_sample.h"
#include "prometheus/registry.h"

namespace weightcache::server {
namespace {

using ::testing::HasSubstr;

using testing::On;
using testing::OnSlot;
using testing::Spec;

class AccessTest : public ::testing::Test {
 protected:
  // Specs: "open" (anyone), "a-only" (team-a), "private" (a copy per namespace of team-a and
  // team-b), "private-unlisted" (a copy per namespace, none listed).
  void Make(bool rules_on) {
    std::unique_ptr<NamespaceRules> rules;
    if (rules_on) {
      rules = std::make_unique<NamespaceRules>(NamespaceRules::Options{}, [this] {
        return absl::StatusOr<kube::DeviceHolders>(holders_);
      });
    }
    PolicyOptions po;
    po.admin_uids = {7};
    access_ = std::make_unique<Access>(
        po, std::move(rules), models_,
        [this](const std::string& peer) -> std::optional<Caller> {
          auto it = peers_.find(peer);
          if (it == peers_.end()) return std::nullopt;
          return it->second;
        },
        /*max_connections_per_pod=*/3, &metrics_);
  }
  double Refusals(const std::string& rule) {
    return testing::Sample(registry_, "weightcache_refusals_total", {{"rule", rule}}, 0);
  }

  ModelCatalog models_{
      {Spec("open"), Spec("a-only", {"team-a"}), Spec("private", {"team-a", "team-b"}, true),
       Spec("private-unlisted", {}, true)},
      1,
      {},
      nullptr};
  prometheus::Registry registry_;
  metrics::Metrics metrics_{registry_, metrics::BuildInfo{"t", "none", "host"}};
  kube::DeviceHolders holders_;
  std::map<std::string, Caller> peers_;
  std::unique_ptr<Access> access_;
};

TEST_F(AccessTest, AnUnknownConnectionIsRefusedAndAnOverCapOneIsToldItsCap) {
  Make(false);
  auto unknown = access_->CallerOf("fd:9");
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(unknown.status().message()), HasSubstr("unknown peer (fd:9)"));

  Caller over = On(1000);
  over.over_cap = true;
  over.unit_connections = 4;
  peers_["fd:10"] = over;
  auto capped = access_->CallerOf("fd:10");
  EXPECT_EQ(capped.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(capped.status().message()),
              HasSubstr("process 1001 holds 4 connections, over the cap of 3 per pod"));
  EXPECT_EQ(Refusals("connection_cap"), 1);

  peers_["fd:11"] = On(1000);
  auto known = access_->CallerOf("fd:11");
  ASSERT_TRUE(known.ok()) << known.status();
  EXPECT_EQ(known->cred.uid, 1000u);
}

TEST_F(AccessTest, AuthorizeCountsARefusalUnderItsRuleAndCheckDoesNot) {
  Make(false);
  const Caller root = On(0);
  const absl::Status checked = access_->Check(root, Verb::kEvict, {});
  EXPECT_EQ(checked.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(Refusals("admin"), 0);
  const absl::Status refused = access_->Authorize(root, Verb::kEvict, {});
  EXPECT_EQ(refused.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(refused.message(), checked.message());
  EXPECT_EQ(Refusals("admin"), 1);
  EXPECT_TRUE(access_->Authorize(On(7), Verb::kEvict, {}).ok());
  EXPECT_TRUE(access_->IsAdmin(On(7)));
  EXPECT_FALSE(access_->rules_on());
}

TEST_F(AccessTest, AModelsObjectCarriesItsSpecsNamespacesAndUnknownNamesNoMetricLabel) {
  Make(false);
  EXPECT_EQ(access_->ModelObject("a-only").allowed_namespaces,
            std::vector<std::string>({"team-a"}));
  // Unknown: no list (its lookup fails later with NOT_FOUND); open: an empty one.
  EXPECT_FALSE(access_->ModelObject("nope").allowed_namespaces.has_value());
  EXPECT_EQ(access_->ModelObject("open").allowed_namespaces, std::vector<std::string>());
  EXPECT_EQ(access_->MetricModel("open"), "open");
  EXPECT_EQ(access_->MetricModel("made-up-by-a-client"), "");
  EXPECT_EQ(access_->MetricModel(""), "");
}

TEST_F(AccessTest, APodOnItsSlotMapsItsNamespacesCopyAndAnAdminLoadsEveryListedOne) {
  holders_.by_device["weightcache-1"] = {"team-b", "engine-b", "engine"};
  Make(true);
  EXPECT_TRUE(access_->rules_on());
  const Caller pod = OnSlot("weightcache-1");
  auto tenant = access_->TenantFor(pod, "private");
  ASSERT_TRUE(tenant.ok()) << tenant.status();
  EXPECT_EQ(*tenant, "team-b");
  EXPECT_EQ(*access_->TenantFor(pod, "open"), "");  // shared: one copy

  auto mine = access_->TenantsToLoad(&pod, models_.Spec("private").value());
  ASSERT_TRUE(mine.ok()) << mine.status();
  EXPECT_EQ(*mine, std::vector<std::string>({"team-b"}));
  auto every = access_->TenantsToLoad(nullptr, models_.Spec("private").value());
  ASSERT_TRUE(every.ok()) << every.status();
  EXPECT_EQ(*every, std::vector<std::string>({"team-a", "team-b"}));
  auto none = access_->TenantsToLoad(nullptr, models_.Spec("private-unlisted").value());
  EXPECT_EQ(none.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(none.status().message()), HasSubstr("lists no allowed_namespaces"));
  EXPECT_EQ(*access_->TenantsToLoad(nullptr, models_.Spec("open").value()),
            std::vector<std::string>({""}));
}

TEST(CheckIsolation, PrivateCopiesNeedTheNamespaceRules) {
  const spec::ModelSpec p = Spec("private", {"team-a"}, true);
  const absl::Status s = CheckIsolation(p, /*rules_enabled=*/false);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(s.message()), HasSubstr("needs the daemon's --namespace_rules"));
  EXPECT_TRUE(CheckIsolation(p, true).ok());
  EXPECT_TRUE(CheckIsolation(Spec("open"), false).ok());
}

}  // namespace
}  // namespace weightcache::server
