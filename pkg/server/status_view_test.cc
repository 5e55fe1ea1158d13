// The status view on its own (status_view.h): the core's parts on the host backend, the
// namespace rules with the kubelet's answer faked, no daemon. What a pod on its slot may see,
// what an admin sees, readiness while a preload is pending, the metrics' snapshots.
#include "pkg/server/internal/status_view.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "pkg/integrity/digest.h"
#include "pkg/server/internal/publish_base.h"
#include "pkg/server/testing/core_parts.h"

namespace weightcache::server {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::kAdmin;
using testing::On;
using testing::OnSlot;

class StatusViewTest : public testing::CorePartsTest {
 protected:
  void SetUp() override {
    spec::ModelSpec b;
    b.name = "b-only";
    b.model_dir = dir_ / "m";
    b.allowed_namespaces = {"team-b"};
    MakeParts({b}, /*m_namespaces=*/{"team-a"});
    // The pod on slot weightcache-1 is team-b's.
    holders_.by_device["weightcache-1"] = {"team-b", "engine-b", "engine"};
    // Slots weightcache-0 and weightcache-2 hold two pods of team-a.
    holders_.by_device["weightcache-0"] = {"team-a", "engine-a0", "engine"};
    holders_.by_device["weightcache-2"] = {"team-a", "engine-a2", "engine"};
    PolicyOptions po;
    po.admin_uids = {kAdmin};
    access_ = std::make_unique<Access>(
        po,
        std::make_unique<NamespaceRules>(
            NamespaceRules::Options{},
            [this] { return absl::StatusOr<kube::DeviceHolders>(holders_); }),
        *models_, nullptr, 16, nullptr);
    leases_ = std::make_unique<LeaseManager>(&registry_, std::chrono::seconds(10));
    base_ = std::make_unique<CorePublishBase>(backend_.get(), *admission_, *models_);
    publishes_ = std::make_unique<PublishManager>(PublishManager::Options{}, backend_.get(),
                                                  registry_, *base_, dir_ / "handle.sock");
    preloads_ =
        std::make_unique<Preloads>(options_.specs, *models_, *admission_, *access_, nullptr);
    acquire_ = std::make_unique<AcquireService>(AcquireService::Options{}, registry_, *models_,
                                                *admission_, *access_, *leases_, *preloads_);
    view_ = std::make_unique<StatusView>(StatusView::Sources{
        .backend = backend_.get(),
        .registry = &registry_,
        .models = models_.get(),
        .access = access_.get(),
        .publisher_of = [this](const cache::Key& k) { return publishes_->PublisherOf(k); },
        .acquire_counts = [this] { return acquire_->counts(); },
        .preloads = preloads_.get()});
  }
  void TearDown() override {
    publishes_.reset();
    StopParts();
  }
  // "m" loaded and ready, with one lease acquired on slot `slot`.
  void LoadM() {
    auto opened = models_->Open("m", false);
    ASSERT_TRUE(opened.ok()) << opened.status();
    const Admission::AskedEnv placed = admission_->Placed(0);
    auto e = admission_->StartLoad(*opened, spec::Layout{}, placed.env, placed.device_uuid);
    ASSERT_TRUE(e.ok()) << e.status();
    ASSERT_TRUE(
        registry_.WaitReady(*e, std::chrono::steady_clock::now() + std::chrono::seconds(30)).ok());
    ASSERT_TRUE(leases_->Issue(*e, "m", OnSlot("weightcache-0"), nullptr).ok());
  }

  kube::DeviceHolders holders_;
  std::unique_ptr<LeaseManager> leases_;
  std::unique_ptr<CorePublishBase> base_;
  std::unique_ptr<PublishManager> publishes_;
  std::unique_ptr<Preloads> preloads_;
  std::unique_ptr<AcquireService> acquire_;
  std::unique_ptr<StatusView> view_;
};

TEST_F(StatusViewTest, APodSeesOnlyTheModelsItMayMapAndAnAdminSeesEverything) {
  LoadM();
  v1::StatusResponse admin;
  view_->Status(On(kAdmin), &admin);
  ASSERT_EQ(admin.entries_size(), 1);
  EXPECT_EQ(admin.entries(0).model(), "m");
  EXPECT_EQ(admin.entries(0).state(), "ready");
  EXPECT_EQ(admin.entries(0).leases_size(), 1);
  EXPECT_THAT(admin.known_models(), ElementsAre("b-only", "m"));
  ASSERT_EQ(admin.models_size(), 2);
  EXPECT_THAT(admin.models(1).cached_ranks(), ElementsAre(0u));
  ASSERT_EQ(admin.devices_size(), 1);
  EXPECT_EQ(admin.devices(0).entries(), 1u);

  v1::StatusResponse pod;
  view_->Status(OnSlot("weightcache-1"), &pod);
  EXPECT_EQ(pod.entries_size(), 0);  // team-a's model: not shown to team-b
  EXPECT_THAT(pod.known_models(), ElementsAre("b-only"));
  ASSERT_EQ(pod.devices_size(), 1);
  EXPECT_EQ(pod.devices(0).entries(), 1u);  // device rows stay whole
}

// Issue 47, finding 1: any root engine read every lease id from Status and released them
// all. A pod sees its own leases; another pod of the same namespace sees the entry and how
// many leases it has, not their ids.
TEST_F(StatusViewTest, APodSeesItsOwnLeasesAndOnlyACountOfOthers) {
  LoadM();
  v1::StatusResponse owner, neighbour, admin;
  view_->Status(OnSlot("weightcache-0"), &owner);
  view_->Status(OnSlot("weightcache-2"), &neighbour);
  view_->Status(On(kAdmin), &admin);
  ASSERT_EQ(owner.entries_size(), 1);
  ASSERT_EQ(owner.entries(0).leases_size(), 1);
  EXPECT_EQ(owner.entries(0).leases(0).owner(), "slot:weightcache-0");
  EXPECT_EQ(owner.entries(0).lease_count(), 1u);
  ASSERT_EQ(neighbour.entries_size(), 1);
  EXPECT_EQ(neighbour.entries(0).leases_size(), 0);
  EXPECT_EQ(neighbour.entries(0).lease_count(), 1u);
  ASSERT_EQ(admin.entries_size(), 1);
  EXPECT_EQ(admin.entries(0).leases_size(), 1);
  EXPECT_EQ(admin.entries(0).leases(0).lease_id(), owner.entries(0).leases(0).lease_id());
}

TEST_F(StatusViewTest, NotReadyWhileAPreloadIsPendingThenReady) {
  preloads_->MarkPending();
  auto [ready, why] = view_->Readiness();
  EXPECT_FALSE(ready);
  EXPECT_THAT(why, HasSubstr("opening b-only, m for preload"));
  preloads_->Release("b-only");
  preloads_->Release("m");
  std::tie(ready, why) = view_->Readiness();
  EXPECT_TRUE(ready) << why;
  EXPECT_TRUE(view_->Listeners().empty());  // no listener yet
  EXPECT_FALSE(view_->Staging().present);   // host backend: no staging pool
}

TEST_F(StatusViewTest, TheMetricsSnapshotsCountEveryEntryByDevice) {
  LoadM();
  const auto entries = view_->Entries();
  ASSERT_EQ(entries.size(), 1u);
  EXPECT_EQ(entries[0].model, "m");
  EXPECT_EQ(entries[0].state, "ready");
  EXPECT_EQ(entries[0].leases, 1u);
  const auto devices = view_->Devices();
  ASSERT_EQ(devices.size(), 1u);
  EXPECT_EQ(devices[0].cache_bytes, entries[0].bytes);
}

// Issue 48: when an entry last matched its digests tells an engine how long a write stays
// unseen, so only an admin sees it; a pod sees -1 (it used to see the age).
TEST_F(StatusViewTest, OnlyAnAdminSeesWhenAnEntryWasLastVerified) {
  registry_.SetDigester(
      [](const cache::Entry&,
         const load::LoadedModel& m) -> absl::StatusOr<std::vector<integrity::SegmentDigest>> {
        return std::vector<integrity::SegmentDigest>(m.segments.size());
      });
  LoadM();
  v1::StatusResponse admin, pod;
  view_->Status(On(kAdmin), &admin);
  view_->Status(OnSlot("weightcache-0"), &pod);
  ASSERT_EQ(admin.entries_size(), 1);
  ASSERT_EQ(pod.entries_size(), 1);
  EXPECT_GE(admin.entries(0).verified_seconds_ago(), 0);
  EXPECT_EQ(pod.entries(0).verified_seconds_ago(), -1);
}

}  // namespace
}  // namespace weightcache::server
