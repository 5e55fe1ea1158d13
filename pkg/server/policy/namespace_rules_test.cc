#include "pkg/server/policy/namespace_rules.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace weightcache::server {
namespace {

using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;

// A fake kubelet answer that the test changes between calls.
struct FakeKubelet {
  absl::StatusOr<kube::DeviceHolders> answer = kube::DeviceHolders{};
  NamespaceRules::Lookup Lookup() {
    return [this] { return answer; };
  }
  void Hold(const std::string& slot, const std::string& ns, const std::string& pod) {
    if (!answer.ok()) answer = kube::DeviceHolders{};
    answer->by_device[slot] = {ns, pod, "engine"};
  }
};

NamespaceRules::Options Ttl(std::chrono::milliseconds ttl) {
  NamespaceRules::Options o;
  o.cache_ttl = ttl;
  return o;
}

const std::vector<std::string> kTeamA = {"team-a"};

TEST(NamespaceRules, OpenModelsNeedNoLookup) {
  FakeKubelet k;
  k.answer = absl::UnavailableError("must not be asked");
  NamespaceRules rules(Ttl(std::chrono::seconds(10)), k.Lookup());
  EXPECT_TRUE(rules.MayMap({"weightcache-0", Clock::now(), false}, "open", {}).ok());
  EXPECT_TRUE(rules.MayMap({"", Clock::now(), false}, "open", {}).ok());
  EXPECT_EQ(rules.lookups(), 0u);
}

TEST(NamespaceRules, PodInAnAllowedNamespaceMapsOthersAreDeniedNamingModelRuleAndPod) {
  FakeKubelet k;
  k.Hold("weightcache-1", "team-a", "engine-a");
  k.Hold("weightcache-3", "team-b", "engine-0");
  NamespaceRules rules(Ttl(std::chrono::seconds(10)), k.Lookup());
  EXPECT_TRUE(rules.MayMap({"weightcache-1", Clock::now(), false}, "llama", kTeamA).ok());
  absl::Status s = rules.MayMap({"weightcache-3", Clock::now(), false}, "llama", kTeamA);
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(s.message(),
            "model 'llama' may be mapped from namespaces [team-a] only; this pod "
            "(team-b/engine-0, slot weightcache-3) is in 'team-b'");
  // Admin uids get no exception on a slot socket.
  EXPECT_EQ(rules.MayMap({"weightcache-3", Clock::now(), true}, "llama", kTeamA).code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(
      rules.MayMap({"weightcache-3", Clock::now(), false}, "llama", {"team-a", "team-b"}).ok());
}

TEST(NamespaceRules, FailsClosedWhenThePodCannotBeIdentified) {
  FakeKubelet k;
  k.answer = absl::UnavailableError("kubelet PodResources API (/x.sock): List: connect failed");
  NamespaceRules rules(Ttl(std::chrono::seconds(10)), k.Lookup());
  absl::Status s = rules.MayMap({"weightcache-2", Clock::now(), false}, "llama", kTeamA);
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(s.message(),
            "model 'llama' may be mapped from namespaces [team-a] only; the pod on slot "
            "weightcache-2 could not be identified, so it is refused (fail closed): kubelet "
            "PodResources API (/x.sock): List: connect failed");

  k.answer = kube::DeviceHolders{};  // reachable, but nobody holds the slot
  s = rules.MayMap({"weightcache-2", Clock::now(), false}, "llama", kTeamA);
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("the kubelet reports no pod holding slot weightcache-2"));

  kube::DeviceHolders two;
  two.conflicting.insert("weightcache-2");
  k.answer = two;
  s = rules.MayMap({"weightcache-2", Clock::now(), false}, "llama", kTeamA);
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(s.message()), HasSubstr("allocated to more than one pod"));
}

TEST(NamespaceRules, SharedSocketMapsRestrictedModelsForAdminsOnly) {
  FakeKubelet k;
  NamespaceRules rules(Ttl(std::chrono::seconds(10)), k.Lookup());
  EXPECT_TRUE(rules.MayMap({"", Clock::now(), true}, "llama", kTeamA).ok());
  absl::Status s = rules.MayMap({"", Clock::now(), false}, "llama", kTeamA);
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(s.message()), HasSubstr("came in on the shared socket"));
  EXPECT_EQ(rules.lookups(), 0u);
}

TEST(NamespaceRules, AnAnswerServesOnlyConnectionsAcceptedBeforeIt) {
  FakeKubelet k;
  k.Hold("weightcache-0", "team-a", "old");
  NamespaceRules rules(Ttl(std::chrono::hours(1)), k.Lookup());
  const auto first_conn = Clock::now();
  ASSERT_TRUE(rules.MayMap({"weightcache-0", first_conn, false}, "llama", kTeamA).ok());
  ASSERT_TRUE(rules.MayMap({"weightcache-0", first_conn, false}, "llama", kTeamA).ok());
  EXPECT_EQ(rules.lookups(), 1u);  // the second answer came from the cache

  // The slot is re-assigned to a pod of another namespace; that pod connects afresh: the
  // cached "team-a" (an hour's TTL) must not answer for it.
  k.answer = kube::DeviceHolders{};
  k.Hold("weightcache-0", "team-b", "new");
  absl::Status s = rules.MayMap({"weightcache-0", Clock::now(), false}, "llama", kTeamA);
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(s.message()), HasSubstr("(team-b/new, slot weightcache-0)"));
  EXPECT_EQ(rules.lookups(), 2u);
}

TEST(NamespaceRules, AnswersExpireAndFailuresAreNotCached) {
  FakeKubelet k;
  k.Hold("weightcache-0", "team-a", "p");
  NamespaceRules rules(Ttl(std::chrono::milliseconds(0)), k.Lookup());
  const auto conn = Clock::now();
  ASSERT_TRUE(rules.MayMap({"weightcache-0", conn, false}, "llama", kTeamA).ok());
  k.answer = absl::UnavailableError("down");
  EXPECT_EQ(rules.MayMap({"weightcache-0", conn, false}, "llama", kTeamA).code(),
            absl::StatusCode::kPermissionDenied);  // TTL 0: asked again, and down
  k.answer = kube::DeviceHolders{};
  k.Hold("weightcache-0", "team-a", "p");
  EXPECT_TRUE(rules.MayMap({"weightcache-0", conn, false}, "llama", kTeamA).ok());
  EXPECT_EQ(rules.lookups(), 3u);
}

}  // namespace
}  // namespace weightcache::server
