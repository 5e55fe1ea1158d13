// The authorization policy as a table: each row a caller, a verb and an object, and the
// decision with the rule that made it. Root engines (uid 0, the common case) hold no role
// unless one is granted (issue 25).
#include "pkg/server/policy/policy.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

#include "pkg/server/policy/namespace_rules.h"

namespace weightcache::server {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// A caller in a pod of its own ("pod-<uid>"), or on its slot.
Caller On(SocketKind socket, uid_t uid = 0, gid_t gid = 0, std::string slot = "") {
  Caller c;
  c.cred.uid = uid;
  c.cred.gid = gid;
  c.socket = socket;
  c.slot = slot;
  if (slot.empty()) {
    c.unit.kind = tenant::UnitKind::kPod;
    c.unit.pod = "pod-" + std::to_string(uid);
  } else {
    c.unit = tenant::Unit::OfSlot(slot, 1);
  }
  c.accepted = std::chrono::steady_clock::now();
  return c;
}

Object Model(const std::string& name, std::vector<std::string> allowed = {}) {
  Object o;
  o.model = name;
  o.allowed_namespaces = std::move(allowed);
  return o;
}

// A lease acquired by `owner` (its unit's key, as the lease manager records it).
Object LeaseOf(const Caller& owner) {
  Object o;
  o.lease = "lease-0123456789abcdef";
  o.owner_unit = owner.unit.Key();
  o.owner_slot = owner.slot;
  return o;
}

TEST(Policy, RootOnTheEngineSocketHoldsNoRoleByDefault) {
  Policy p({}, nullptr);
  const Caller root = On(SocketKind::kEngine);
  EXPECT_FALSE(p.IsAdmin(root));
  for (Verb v : {Verb::kDefine, Verb::kEvict, Verb::kVerify}) {
    const Decision d = p.Decide(root, v, {});
    EXPECT_FALSE(d.allowed) << VerbName(v);
    EXPECT_EQ(d.rule, "admin") << VerbName(v);
    EXPECT_THAT(d.reason, HasSubstr("uid 0 (gid 0) on the engine socket may not"));
  }
  const Decision pub = p.Decide(root, Verb::kPublish, Model("m"));
  EXPECT_FALSE(pub.allowed);
  EXPECT_EQ(pub.rule, "publish");
  EXPECT_THAT(pub.reason, HasSubstr("--publish_uids/--publish_gids"));
  // The engine role: acquire, load a known model, status; its own leases.
  for (Verb v : {Verb::kAcquire, Verb::kLoad, Verb::kStatus}) {
    EXPECT_TRUE(p.Decide(root, v, Model("m")).allowed) << VerbName(v);
  }
  EXPECT_TRUE(p.Decide(root, Verb::kRelease, LeaseOf(root)).allowed);
  const Decision other = p.Decide(root, Verb::kRelease, LeaseOf(On(SocketKind::kEngine, 1000)));
  EXPECT_FALSE(other.allowed);
  EXPECT_EQ(other.rule, "lease_owner");
  EXPECT_THAT(other.reason, HasSubstr("lease lease-012345 was acquired by another pod"));
}

// Issue 47, finding 1: policy.cc let a uid release any lease of the same uid (and this suite
// asserted it); every engine pod is root, so any pod read the lease ids from Status and
// ended them all. The owner is the pod.
TEST(Policy, ARootPodCannotReleaseAnotherRootPodsLease) {
  Policy p({}, nullptr);
  Caller a = On(SocketKind::kEngine);
  Caller b = On(SocketKind::kEngine);
  b.unit.pod = "another-pod";
  const Decision d = p.Decide(b, Verb::kRelease, LeaseOf(a));
  EXPECT_FALSE(d.allowed);
  EXPECT_EQ(d.rule, "lease_owner");
  EXPECT_THAT(d.reason, HasSubstr("this connection's (pod another-pod)"));
  EXPECT_THAT(d.reason, Not(HasSubstr("pod-0")));  // the owner's pod is not named
  EXPECT_TRUE(p.Decide(a, Verb::kRelease, LeaseOf(a)).allowed);
  // Outside Kubernetes the process is the unit: another process of the same uid may not.
  Caller p1 = On(SocketKind::kEngine), p2 = On(SocketKind::kEngine);
  p1.unit = {};
  p1.unit.kind = tenant::UnitKind::kProcess;
  p1.unit.pid = 10;
  p1.unit.start_ticks = 5;
  p2.unit = p1.unit;
  p2.unit.pid = 11;
  EXPECT_FALSE(p.Decide(p2, Verb::kRelease, LeaseOf(p1)).allowed);
  EXPECT_TRUE(p.Decide(p1, Verb::kRelease, LeaseOf(p1)).allowed);
  // A peer the daemon cannot place (pid not visible) releases nothing, not even "its own".
  Caller unseen = On(SocketKind::kEngine);
  unseen.unit = {};
  const Decision u = p.Decide(unseen, Verb::kRelease, LeaseOf(unseen));
  EXPECT_FALSE(u.allowed);
  EXPECT_THAT(u.reason, HasSubstr("hostPID"));
}

TEST(Policy, TheAdminSocketIsAdminAndPublisher) {
  PolicyOptions o;
  o.admin_socket = "/run/weightcache-admin/control.sock";
  Policy p(o, nullptr);
  const Caller op = On(SocketKind::kAdmin, 1234, 1234);
  EXPECT_TRUE(p.IsAdmin(op));
  for (Verb v : {Verb::kDefine, Verb::kEvict, Verb::kVerify}) {
    EXPECT_TRUE(p.Decide(op, v, {}).allowed);
  }
  EXPECT_TRUE(p.Decide(op, Verb::kPublish, Model("m")).allowed);
  EXPECT_TRUE(p.Decide(op, Verb::kRelease, LeaseOf(On(SocketKind::kEngine))).allowed);
  // A refusal elsewhere says where admin operations go.
  EXPECT_THAT(p.Decide(On(SocketKind::kEngine), Verb::kEvict, {}).reason,
              HasSubstr("the admin socket /run/weightcache-admin/control.sock"));
}

TEST(Policy, RolesOnTheEngineSocketAreGrantedByUidOrGid) {
  PolicyOptions o;
  o.admin_uids = {4242};
  o.publish_gids = {77};
  Policy p(o, nullptr);
  EXPECT_TRUE(p.Decide(On(SocketKind::kEngine, 4242), Verb::kEvict, {}).allowed);
  EXPECT_FALSE(p.Decide(On(SocketKind::kEngine, 0), Verb::kEvict, {}).allowed);
  EXPECT_TRUE(p.Decide(On(SocketKind::kEngine, 5, 77), Verb::kPublish, Model("m")).allowed);
  EXPECT_FALSE(p.Decide(On(SocketKind::kEngine, 0, 0), Verb::kPublish, Model("m")).allowed);
  // An admin publishes too.
  EXPECT_TRUE(p.Decide(On(SocketKind::kEngine, 4242), Verb::kPublish, Model("m")).allowed);
}

struct FakeKubelet {
  kube::DeviceHolders holders;
  NamespaceRules::Lookup Lookup() {
    return [this]() -> absl::StatusOr<kube::DeviceHolders> { return holders; };
  }
  // Slot weightcache-1 held by a pod of team-a, weightcache-3 by one of team-b.
  static FakeKubelet TwoTeams() {
    FakeKubelet k;
    k.holders.by_device["weightcache-1"] = {"team-a", "engine-a", "engine"};
    k.holders.by_device["weightcache-3"] = {"team-b", "engine-b", "engine"};
    return k;
  }
};

TEST(Policy, SlotSocketsAreNeverAdminAndPublishByNamespace) {
  FakeKubelet k = FakeKubelet::TwoTeams();
  NamespaceRules rules({}, k.Lookup());
  PolicyOptions o;
  o.admin_uids = {0};  // uids say nothing on slot sockets: every pod is root
  o.publish_uids = {0};
  o.publish_namespaces = {"team-a"};
  Policy p(o, &rules);
  const Caller a = On(SocketKind::kSlot, 0, 0, "weightcache-1");
  const Caller b = On(SocketKind::kSlot, 0, 0, "weightcache-3");
  EXPECT_FALSE(p.IsAdmin(a));
  EXPECT_EQ(p.Decide(a, Verb::kEvict, {}).rule, "admin");
  EXPECT_TRUE(p.Decide(a, Verb::kPublish, Model("open")).allowed);
  const Decision pb = p.Decide(b, Verb::kPublish, Model("open"));
  EXPECT_FALSE(pb.allowed);
  EXPECT_EQ(pb.rule, "publish");
  EXPECT_THAT(pb.reason, HasSubstr("--publish_namespaces"));
  EXPECT_THAT(pb.reason, HasSubstr("(team-b/engine-b) is in 'team-b'"));
  // A publisher still meets the base model's map rule.
  const Decision restricted = p.Decide(a, Verb::kPublish, Model("secret", {"team-c"}));
  EXPECT_FALSE(restricted.allowed);
  EXPECT_EQ(restricted.rule, "namespace");
  // A slot nobody holds publishes nothing (fail closed).
  const Decision empty =
      p.Decide(On(SocketKind::kSlot, 0, 0, "weightcache-2"), Verb::kPublish, Model("open"));
  EXPECT_FALSE(empty.allowed);
  EXPECT_THAT(empty.reason, HasSubstr("could not be identified"));
  // A lease is released on the socket it was acquired on only.
  EXPECT_TRUE(p.Decide(a, Verb::kRelease, LeaseOf(a)).allowed);
  const Decision cross = p.Decide(b, Verb::kRelease, LeaseOf(a));
  EXPECT_FALSE(cross.allowed);
  EXPECT_EQ(cross.rule, "lease_owner");
  EXPECT_THAT(cross.reason, HasSubstr("slot's pod (slot weightcache-1's socket)"));
}

// isolation: namespace. A private copy is mapped and seen only by pods of its namespace (and
// admins), whatever the model's own rule; the refusal does not name the copy's namespace.
// The caller's copy is its pod's namespace; the shared socket names none.
TEST(Policy, APrivateCopyIsItsNamespacesAlone) {
  FakeKubelet k = FakeKubelet::TwoTeams();
  NamespaceRules rules({}, k.Lookup());
  PolicyOptions o;
  o.admin_uids = {7};
  Policy p(o, &rules);
  const Caller a = On(SocketKind::kSlot, 0, 0, "weightcache-1");
  const Caller b = On(SocketKind::kSlot, 0, 0, "weightcache-3");
  Object copy = Model("m");  // open to all: the copy's namespace still decides
  copy.tenant = "team-a";
  for (Verb v : {Verb::kAcquire, Verb::kStatus}) {
    EXPECT_TRUE(p.Decide(a, v, copy).allowed) << VerbName(v);
    const Decision d = p.Decide(b, v, copy);
    EXPECT_FALSE(d.allowed) << VerbName(v);
    EXPECT_EQ(d.rule, "namespace");
    EXPECT_THAT(d.reason, HasSubstr("another namespace's private copy"));
    EXPECT_THAT(d.reason, ::testing::Not(HasSubstr("team-a")));
    EXPECT_TRUE(p.Decide(On(SocketKind::kEngine, 7), v, copy).allowed) << VerbName(v);
    EXPECT_TRUE(p.Decide(On(SocketKind::kAdmin, 1000), v, copy).allowed) << VerbName(v);
    EXPECT_FALSE(p.Decide(On(SocketKind::kEngine, 0), v, copy).allowed) << VerbName(v);
    // A slot nobody holds: fail closed.
    EXPECT_FALSE(p.Decide(On(SocketKind::kSlot, 0, 0, "weightcache-2"), v, copy).allowed);
  }
  EXPECT_EQ(p.TenantOf(a, "m").value_or(""), "team-a");
  EXPECT_EQ(p.TenantOf(b, "m").value_or(""), "team-b");
  EXPECT_EQ(p.TenantOf(On(SocketKind::kEngine, 7), "m").status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(p.TenantOf(On(SocketKind::kSlot, 0, 0, "weightcache-2"), "m").status().code(),
            absl::StatusCode::kPermissionDenied);
  // Namespace rules off: no private copy is served to anyone but admins.
  Policy off(o, nullptr);
  EXPECT_FALSE(off.Decide(On(SocketKind::kEngine, 0), Verb::kAcquire, copy).allowed);
}

TEST(Policy, UnknownModelsAreLeftToTheirLookup) {
  FakeKubelet k;
  NamespaceRules rules({}, k.Lookup());
  Policy p({}, &rules);
  Object unknown;
  unknown.model = "nope";  // no allowed_namespaces: not known
  EXPECT_TRUE(
      p.Decide(On(SocketKind::kSlot, 0, 0, "weightcache-1"), Verb::kAcquire, unknown).allowed);
}

}  // namespace
}  // namespace weightcache::server
