// Release in its unit (lease_manager.h), without a daemon: the release rule is Access's (its
// link), the lease's handle connection is closed through the other link, and nothing is
// closed for a lease that was refused or is not active.
#include "pkg/server/internal/lease_manager.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "pkg/server/testing/core_parts.h"

namespace weightcache::server {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::kAdmin;
using testing::On;

class LeaseManagerTest : public testing::CorePartsTest {
 protected:
  void SetUp() override {
    MakeParts();
    leases_ = std::make_unique<LeaseManager>(
        &registry_, std::chrono::seconds(10),
        LeaseManager::Links{
            .authorize = [this](const Caller& c, Verb v,
                                const Object& o) { return access_->Authorize(c, v, o); },
            .close = [this](const std::string& id) { closed_.push_back(id); }});
  }
  void TearDown() override { StopParts(); }
  // "m" loaded and ready, leased by `owner`: the lease id.
  std::string LeaseM(const Caller& owner) {
    auto opened = models_->Open("m", false);
    EXPECT_TRUE(opened.ok()) << opened.status();
    const Admission::AskedEnv placed = admission_->Placed(0);
    auto e = admission_->StartLoad(*opened, spec::Layout{}, placed.env, placed.device_uuid);
    EXPECT_TRUE(e.ok()) << e.status();
    EXPECT_TRUE(
        registry_.WaitReady(*e, std::chrono::steady_clock::now() + std::chrono::seconds(30)).ok());
    auto issued = leases_->Issue(*e, "m", owner, nullptr);
    EXPECT_TRUE(issued.ok()) << issued.status();
    return issued.ok() ? issued->lease_id : "";
  }

  std::unique_ptr<LeaseManager> leases_;
  std::vector<std::string> closed_;  // what the close link was asked to close
};

TEST_F(LeaseManagerTest, ReleaseAsksTheRuleThenEndsTheLeaseAndClosesItsConnection) {
  const std::string lease = LeaseM(On(0));
  // Another process (another tenant unit) is refused by Access's rule: the lease stays.
  const absl::Status other = leases_->Release(On(1), lease);
  EXPECT_EQ(other.code(), absl::StatusCode::kPermissionDenied) << other;
  EXPECT_TRUE(registry_.FindLease(lease).has_value());
  EXPECT_TRUE(closed_.empty());
  // Its owner ends it; its handle connection is closed once, by id.
  EXPECT_TRUE(leases_->Release(On(0), lease).ok());
  EXPECT_FALSE(registry_.FindLease(lease).has_value());
  EXPECT_THAT(closed_, ElementsAre(lease));
  // Gone now: NOT_FOUND naming it, nothing closed again.
  const absl::Status again = leases_->Release(On(kAdmin), lease);
  EXPECT_EQ(again.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(again.message()), HasSubstr(lease));
  EXPECT_EQ(closed_.size(), 1u);
}

TEST_F(LeaseManagerTest, AnAdminReleasesAnotherUnitsLease) {
  const std::string lease = LeaseM(On(0));
  EXPECT_TRUE(leases_->Release(On(kAdmin), lease).ok());
  EXPECT_THAT(closed_, ElementsAre(lease));
}

}  // namespace
}  // namespace weightcache::server
