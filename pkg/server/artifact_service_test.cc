// The artifact RPCs' service on its own (artifacts.h): a real store, catalog and access, no
// daemon, no sockets. Who may put, get and evict; the key a private model's artifact goes
// under; the token's handle socket; each result counted.
#include "pkg/server/publish/artifact_service.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "pkg/metrics/metrics.h"
#include "pkg/server/internal/publish_base.h"
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
  void SetUp() override { Make(); }
  // The service, with the namespace rules on or off (slots 1 and 2: pods of team-a and
  // team-b, both publishing namespaces), a store of `store` and puts watched per `puts`.
  // `per_unit`, `tenants`: the shares of the budget (ArtifactService::Options).
  void Make(bool rules_on = false, artifact::StoreOptions store_options = {},
            PutWatch::Options puts = {}, uint64_t per_unit = net::KeyedLimiter::kUnbounded,
            uint64_t tenants = net::KeyedLimiter::kUnbounded) {
    service_.reset();
    access_.reset();
    std::unique_ptr<NamespaceRules> rules;
    if (rules_on) {
      kube::DeviceHolders holders;
      holders.by_device["weightcache-1"] = {"team-a", "engine-a", "engine"};
      holders.by_device["weightcache-2"] = {"team-b", "engine-b", "engine"};
      rules = std::make_unique<NamespaceRules>(NamespaceRules::Options{}, [holders] {
        return absl::StatusOr<kube::DeviceHolders>(holders);
      });
    }
    PolicyOptions po;
    po.admin_uids = {kAdmin};
    po.publish_uids = {kPublisher};
    po.publish_namespaces = {"team-a", "team-b"};
    access_ = std::make_unique<Access>(po, std::move(rules), models_, nullptr, 16, &metrics_);
    rules_ = std::make_unique<CoreArtifactRules>(*access_, models_);
    auto store = artifact::Store::Open(std::move(store_options));
    ASSERT_TRUE(store.ok()) << store.status();
    service_ = std::make_unique<ArtifactService>(
        ArtifactService::Options{.handle_socket = "/run/wc/handle.sock",
                                 .slot_handle_socket = "/wc/handle.sock",
                                 .dir = "",
                                 .token_ttl = std::chrono::seconds(10),
                                 .puts = puts,
                                 .reserve_per_unit = per_unit,
                                 .reserve_tenants = tenants},
        std::move(store).value(), *rules_, &metrics_);
  }
  // A get of `key` by `who`: the artifact's id, or the error.
  absl::StatusOr<std::string> GetId(const Caller& who, const v1::ArtifactKey& key) {
    v1::GetArtifactRequest req;
    *req.mutable_key() = key;
    v1::GetArtifactResponse got;
    if (absl::Status s = service_->Get(who, req, &got); !s.ok()) return s;
    return got.id();
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
        resp, [] {});
  }
  double Artifacts(const std::string& op, const std::string& result) {
    return testing::Sample(registry_, "weightcache_artifact_requests_total",
                           {{"op", op}, {"result", result}}, 0);
  }

  static spec::ModelSpec WithPublishers(spec::ModelSpec s, std::vector<std::string> p) {
    s.publishers = std::move(p);
    return s;
  }
  static spec::ModelSpec WithNativePublishers(spec::ModelSpec s, std::vector<std::string> p) {
    s.native_publishers = std::move(p);
    return s;
  }
  ModelCatalog models_{{Spec("m"), Spec("a-only", {"team-a"}),
                        WithPublishers(Spec("b-publishes"), {"team-b", "uid:1000"}),
                        WithNativePublishers(Spec("native-by-1000"), {"uid:1000"})},
                       1,
                       {},
                       nullptr};
  prometheus::Registry registry_;
  metrics::Metrics metrics_{registry_, metrics::BuildInfo{"t", "none", "host"}};
  std::unique_ptr<Access> access_;
  std::unique_ptr<CoreArtifactRules> rules_;
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

// Issue 47, finding 3: with the namespace rules on, a shared model's artifacts were one pool,
// so team-a's publisher could put under the very key team-b's engines compute (every field
// predictable) and team-b's compile_cache loaded and ran it; the first put won and
// persisted. Now every key carries the putter's pool: team-b misses, puts its own, and an
// admin's put is what both namespaces share.
TEST_F(ArtifactServiceTest, WithNamespaceRulesEachNamespacePutsIntoItsOwnPool) {
  Make(/*rules_on=*/true);
  const Caller team_a = testing::OnSlot("weightcache-1");
  const Caller team_b = testing::OnSlot("weightcache-2");
  v1::PutArtifactResponse planted;
  ASSERT_TRUE(Put(team_a, Key(), "team-a's code", &planted).ok());
  auto b_sees = GetId(team_b, Key());
  EXPECT_EQ(b_sees.status().code(), absl::StatusCode::kNotFound)
      << "old code: team-b was served team-a's " << planted.id();
  auto a_sees = GetId(team_a, Key());
  ASSERT_TRUE(a_sees.ok()) << a_sees.status();
  EXPECT_EQ(*a_sees, planted.id());

  // team-b's own put of the same key is its own artifact (old code: ALREADY_EXISTS).
  v1::PutArtifactResponse own;
  ASSERT_TRUE(Put(team_b, Key(), "team-b's code", &own).ok());
  EXPECT_NE(own.id(), planted.id());
  EXPECT_EQ(GetId(team_b, Key()).value_or(""), own.id());

  // An admin's put is seen by both (their own pool first, then the admin's).
  v1::ArtifactKey shared = Key();
  shared.set_settings_hash("mode=max-autotune");
  v1::PutArtifactResponse admins;
  ASSERT_TRUE(Put(On(kEngine, SocketKind::kAdmin), shared, "vetted", &admins).ok());
  EXPECT_EQ(GetId(team_a, shared).value_or(""), admins.id());
  EXPECT_EQ(GetId(team_b, shared).value_or(""), admins.id());
  // Status shows team-b its own pool's and the admin's, not team-a's.
  v1::StatusResponse shown;
  service_->AppendStatus(
      team_b, /*filtered=*/true, [](const std::string&) { return true; }, &shown);
  std::set<std::string> ids;
  for (const auto& a : shown.artifacts()) ids.insert(a.id());
  EXPECT_EQ(ids, std::set<std::string>({own.id(), admins.id()}));

  // Outside every namespace's pool, only an admin's put vouches for itself: one a publisher
  // put there before pools existed is not served to pods.
  v1::ArtifactKey legacy = Key();
  legacy.set_settings_hash("mode=legacy");
  auto slot = service_->store().BeginPut(KeyFromWire(legacy, ""), 4);
  ASSERT_TRUE(slot.ok()) << slot.status();
  ASSERT_TRUE((*slot)->Append("old!").ok());
  ASSERT_TRUE((*slot)->Commit({.pid = 1, .uid = 0, .slot = "weightcache-1"}).ok());
  EXPECT_EQ(GetId(team_b, legacy).status().code(), absl::StatusCode::kNotFound);
}

// A spec's `publishers:` says who may publish for the model; a refusal names the rule.
TEST_F(ArtifactServiceTest, ASpecsPublishersRefuseEveryoneElseNamingTheRule) {
  Make(/*rules_on=*/true);
  v1::PutArtifactResponse put;
  const absl::Status a = Put(testing::OnSlot("weightcache-1"), Key("b-publishes"), "x", &put);
  EXPECT_EQ(a.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(a.message()),
              ::testing::AllOf(HasSubstr("publishers: [team-b, uid:1000]"),
                               HasSubstr("this pod (team-a/engine-a) is in 'team-a'")));
  EXPECT_EQ(testing::Sample(registry_, "weightcache_refusals_total", {{"rule", "publishers"}}, 0),
            1);
  EXPECT_TRUE(Put(testing::OnSlot("weightcache-2"), Key("b-publishes"), "x", &put).ok());
  EXPECT_TRUE(Put(On(kPublisher), Key("b-publishes"), "y", &put).ok()) << "uid:1000 is listed";
  EXPECT_TRUE(Put(On(kAdmin), Key("b-publishes"), "z", &put).ok()) << "admins always";
  // Without the rules, the listed uid publishes as well.
  Make(/*rules_on=*/false);
  EXPECT_TRUE(Put(On(kPublisher), Key("b-publishes"), "y", &put).ok());
}

// A put whose reads the test controls: the key and `declared` size with one byte, then a
// byte every `every` (0: nothing) until the watchdog cancels it or Release().
class SlowPut {
 public:
  SlowPut(ArtifactService& service, Caller who, v1::ArtifactKey key, uint64_t declared,
          std::chrono::milliseconds every = std::chrono::milliseconds(0))
      : thread_([this, &service, who = std::move(who), key = std::move(key), declared, every] {
          int reads = 0;
          v1::PutArtifactResponse resp;
          const absl::Status s = service.Put(
              who,
              [&](v1::PutArtifactRequest* m) {
                std::unique_lock l(mu_);
                if (reads++ == 0) {
                  *m->mutable_key() = key;
                  m->set_size(declared);
                  m->set_data("x");
                  return true;
                }
                started_ = true;  // past BeginPut: its reservation is held
                cv_.notify_all();
                const auto wait = every.count() > 0 ? every : std::chrono::hours(1);
                if (cv_.wait_for(l, wait, [&] { return ended_; })) return false;
                m->set_data("x");
                return true;
              },
              &resp,
              [this] {
                std::lock_guard l(mu_);
                ended_ = true;
                cancelled_ = true;
                cv_.notify_all();
              });
          std::lock_guard l(mu_);
          status_ = s;
          returned_ = started_ = true;
          cv_.notify_all();
        }) {}
  ~SlowPut() {
    Release();
    thread_.join();
  }
  // Until the put holds its reservation and reads on, or returned.
  void WaitStarted() {
    std::unique_lock l(mu_);
    cv_.wait(l, [&] { return started_; });
  }
  // Until it returned: its status.
  absl::Status Wait() {
    std::unique_lock l(mu_);
    cv_.wait(l, [&] { return returned_; });
    return status_;
  }
  bool returned() {
    std::lock_guard l(mu_);
    return returned_;
  }
  bool cancelled() {
    std::lock_guard l(mu_);
    return cancelled_;
  }
  void Release() {
    std::lock_guard l(mu_);
    ended_ = true;
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool started_ = false, ended_ = false, returned_ = false, cancelled_ = false;
  absl::Status status_;
  std::thread thread_;  // last
};

// A caller whose unit accept has not resolved (kUnknown, pid 0): told apart by its peer pid.
Caller OfUnit(uid_t uid, pid_t pid) {
  Caller c = On(uid);
  c.cred.pid = pid;
  c.unit.kind = tenant::UnitKind::kProcess;
  c.unit.pid = pid;
  return c;
}

constexpr uint64_t kMiB = 1 << 20;

// Issue 47, finding 4: eight puts that each declared 60 MiB and sent a byte every 6 s held
// 472 MiB against a 100 MiB --artifact_budget (the daemon counted 1,020 bytes resident) and
// refused every other publisher ("8 artifact puts are in progress") for up to 300 s. Now
// each reserves its declared size at its first message: floor(100/60) = 1 is taken, the
// other seven are refused at once naming the budget, resident + reserved stays within it,
// and another tenant's small put still succeeds.
TEST_F(ArtifactServiceTest, EightSlow60MiBPutsCannotExceedA100MiBBudget) {
  Make(false, {.budget_bytes = 100 * kMiB, .max_artifact_bytes = 100 * kMiB, .dir = ""});
  std::vector<std::unique_ptr<SlowPut>> puts;
  int refused = 0;
  for (int i = 0; i < 8; ++i) {
    auto k = Key();
    k.set_settings_hash("slow-" + std::to_string(i));
    puts.push_back(std::make_unique<SlowPut>(*service_, OfUnit(kPublisher, 100 + i), k, 60 * kMiB));
    puts.back()->WaitStarted();
    if (puts.back()->returned()) {
      const absl::Status s = puts.back()->Wait();
      EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
      EXPECT_THAT(std::string(s.message()), HasSubstr("reserved by 1 put(s) in flight"));
      EXPECT_THAT(std::string(s.message()), HasSubstr("--artifact_budget"));
      ++refused;
    }
    const artifact::Usage u = service_->store().usage();
    EXPECT_LE(u.resident_bytes + u.reserved_bytes, u.budget_bytes);
  }
  EXPECT_EQ(refused, 7) << "old code: all 8 taken";
  EXPECT_EQ(service_->store().usage().reserved_bytes, 60 * kMiB);
  v1::PutArtifactResponse small;
  ASSERT_TRUE(Put(OfUnit(kPublisher, 999), Key("a-only"), std::string(4096, 's'), &small).ok());
  EXPECT_EQ(Artifacts("put", "busy"), 7);
  puts.clear();  // released: fewer bytes than declared, nothing stored, reservations back
  EXPECT_EQ(service_->store().usage().reserved_bytes, 0u);
}

// Issue 57, finding 4: an AOTInductor package is native code every engine with its key
// dlopens, yet any granted publisher put one (a crashing constructor crash-looped every such
// engine). Now native code is taken only from admins and the publishers the spec names for
// it (native_publishers), and served only while that holds: one planted in the store by
// another publisher (an older daemon's, or before the spec changed) is as absent.
TEST_F(ArtifactServiceTest, PlantedNativeCodeFromAPublisherTheSpecDoesNotNameIsNotServed) {
  v1::ArtifactKey k = Key();
  k.set_kind("aoti-package");
  v1::PutArtifactResponse put;
  const absl::Status planted = Put(On(kPublisher), k, "ELF-constructor-crashes", &put);
  EXPECT_EQ(planted.code(), absl::StatusCode::kPermissionDenied) << "old code: stored";
  EXPECT_THAT(std::string(planted.message()),
              ::testing::AllOf(HasSubstr("may not publish native code"),
                               HasSubstr("native_publishers: []")));
  // The same key as a torch-compile cache (which engines read, not dlopen) is still theirs.
  EXPECT_TRUE(Put(On(kPublisher), Key(), "graph", &put).ok());

  // Planted in the store directly, as a daemon before this rule kept it.
  auto slot = service_->store().BeginPut(KeyFromWire(k, ""), 3);
  ASSERT_TRUE(slot.ok()) << slot.status();
  ASSERT_TRUE((*slot)->Append("ELF").ok());
  artifact::Publisher by;
  by.uid = kPublisher;
  ASSERT_TRUE((*slot)->Commit(by).ok());
  auto got = GetId(On(kEngine), k);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kNotFound) << "old code: served";
  EXPECT_THAT(std::string(got.status().message()),
              ::testing::AllOf(HasSubstr("put by uid 1000"), HasSubstr("is not served"),
                               HasSubstr("uid:1000 is not named")));

  // An admin's is served; so is one by a publisher the spec names for native code.
  v1::ArtifactKey k2 = k;
  k2.set_settings_hash("admins");
  ASSERT_TRUE(Put(On(kAdmin), k2, "vetted", &put).ok());
  EXPECT_EQ(GetId(On(kEngine), k2).value_or(""), put.id());
  v1::ArtifactKey named = k;
  named.set_model("native-by-1000");
  ASSERT_TRUE(Put(On(kPublisher), named, "named", &put).ok());
  EXPECT_EQ(GetId(On(kEngine), named).value_or(""), put.id());
}

// Issue 56, finding 5: one publisher's reservations held the whole budget (a 64 MiB put
// kept alive refused the admin's 40 MiB puts 4 of 4; with the defaults one pod's 2 x 512 MiB
// reserved all of 1 GiB). Now a pod's puts reserve at most its share (here 32 of 128 MiB),
// the pods' together at most the budget less one share, and the admin's are not counted:
// pod A's second put (64 MiB) is refused naming the flag, and the admin's 40 MiB put and pod
// B's fit (old code: A held 96 MiB and the admin's put was refused). With three pods at their
// share, a fourth is refused naming the pods' part, and the admin's put still fits.
TEST_F(ArtifactServiceTest, OnePodsLongPutsCannotRefuseTheAdminsOrAnotherPodsPut) {
  Make(false, {.budget_bytes = 128 * kMiB, .max_artifact_bytes = 128 * kMiB, .dir = ""}, {},
       32 * kMiB, 96 * kMiB);
  const auto keyed = [](const std::string& hash) {
    auto k = Key();
    k.set_settings_hash(hash);
    return k;
  };
  SlowPut a0(*service_, OfUnit(kPublisher, 41), keyed("a-0"), 32 * kMiB);
  a0.WaitStarted();
  ASSERT_FALSE(a0.returned()) << a0.Wait();
  SlowPut a1(*service_, OfUnit(kPublisher, 41), keyed("a-1"), 64 * kMiB);
  a1.WaitStarted();
  EXPECT_TRUE(a1.returned()) << "old code: pod A's two puts reserve 96 of 128 MiB";

  v1::PutArtifactResponse put;
  const absl::Status admins =
      Put(On(kAdmin), keyed("admin-40"), std::string(40 * kMiB, 'a'), &put, kMiB);
  EXPECT_TRUE(admins.ok()) << admins;
  EXPECT_EQ(put.bytes(), 40 * kMiB);
  const absl::Status b =
      Put(OfUnit(kPublisher, 42), keyed("b-32"), std::string(32 * kMiB, 'b'), &put, kMiB);
  EXPECT_TRUE(b.ok()) << b;
  ASSERT_TRUE(a1.returned());
  const absl::Status over = a1.Wait();
  EXPECT_EQ(over.code(), absl::StatusCode::kResourceExhausted) << over;
  EXPECT_THAT(std::string(over.message()),
              ::testing::AllOf(HasSubstr("process 41's puts in flight reserve 33554432 of the "
                                         "33554432 bytes"),
                               HasSubstr("--artifact_reserve_per_unit")));
  EXPECT_EQ(service_->store().usage().reserved_bytes, 32 * kMiB);

  // The pods' part: A, C and D at their share hold 96 MiB; E is refused naming it.
  SlowPut c(*service_, OfUnit(kPublisher, 43), keyed("c"), 32 * kMiB);
  c.WaitStarted();
  SlowPut d(*service_, OfUnit(kPublisher, 44), keyed("d"), 32 * kMiB);
  d.WaitStarted();
  ASSERT_FALSE(c.returned() || d.returned()) << c.Wait() << d.Wait();
  const absl::Status e = Put(OfUnit(kPublisher, 45), keyed("e"), "e", &put);
  EXPECT_EQ(e.code(), absl::StatusCode::kResourceExhausted) << e;
  EXPECT_THAT(std::string(e.message()),
              HasSubstr("the pods' puts in flight reserve 100663296 of the 100663296 bytes"));
  // The share they cannot hold is the admin's: its put of a share's size fits.
  const absl::Status admins2 =
      Put(On(kAdmin), keyed("admin-32"), std::string(32 * kMiB, 'z'), &put, kMiB);
  EXPECT_TRUE(admins2.ok()) << admins2;
}

// At most a few puts in flight per tenant unit (a pod, never a uid: every engine is root);
// here units that accept did not resolve, told apart by their peers' pids.
TEST_F(ArtifactServiceTest, APodHasAtMostItsCapOfPutsInFlight) {
  Make(false, {}, {.max_total = 8, .max_per_unit = 2});
  std::vector<std::unique_ptr<SlowPut>> mine;
  for (int i = 0; i < 2; ++i) {
    auto k = Key();
    k.set_settings_hash("a-" + std::to_string(i));
    mine.push_back(std::make_unique<SlowPut>(*service_, OfUnit(kPublisher, 41), k, 100));
    mine.back()->WaitStarted();
    ASSERT_FALSE(mine.back()->returned()) << mine.back()->Wait();
  }
  v1::PutArtifactResponse put;
  const absl::Status third = Put(OfUnit(kPublisher, 41), Key(), "x", &put);
  EXPECT_EQ(third.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(third.message()),
              ::testing::AllOf(HasSubstr("process 41 has 2 artifact puts in progress"),
                               HasSubstr("--artifact_max_puts_per_unit")));
  EXPECT_TRUE(Put(OfUnit(kPublisher, 42), Key(), "x", &put).ok()) << "another unit is not held";
}

// A put that trickles (a byte every 20 ms: fewer than 64 KiB per idle window) is ended by
// the watchdog, and its reservation is free again at once (old: held up to 300 s).
TEST_F(ArtifactServiceTest, AStalledPutIsEndedAndItsReservationFreed) {
  Make(false, {.budget_bytes = 100 * kMiB, .max_artifact_bytes = 100 * kMiB, .dir = ""},
       {.idle = std::chrono::milliseconds(300)});
  const auto t0 = std::chrono::steady_clock::now();
  SlowPut slow(*service_, OfUnit(kPublisher, 7), Key(), 60 * kMiB, std::chrono::milliseconds(20));
  const absl::Status s = slow.Wait();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(20));
  EXPECT_TRUE(slow.cancelled());
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("stalled"));
  EXPECT_EQ(service_->store().usage().reserved_bytes, 0u);
  v1::PutArtifactResponse put;
  EXPECT_TRUE(Put(OfUnit(kPublisher, 8), Key(), std::string(kMiB, 'z'), &put).ok());
}

}  // namespace
}  // namespace weightcache::server
