// The integrity service on its own (integrity_service.h): host backend, a real registry,
// catalog, admission and access, no daemon and no sockets. A change the host backend's
// sealed memory cannot have is modelled by the digest hook, as the daemon's tests do.
#include "pkg/server/internal/integrity_service.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "pkg/memory/backend.h"
#include "pkg/safetensors/writer.h"
#include "pkg/server/testing/core_parts.h"
#include "pkg/server/wire/handle_message.h"
#include "pkg/util/status_macros.h"

namespace weightcache::server {
namespace {

using ::testing::HasSubstr;

using testing::kAdmin;
using testing::On;

class IntegrityServiceTest : public testing::CorePartsTest {
 protected:
  void SetUp() override {
    MakeParts();
    IntegrityService::Links links;
    links.notify = [this](const std::string& id, const std::string& line) {
      told_.emplace_back(id, line);
    };
    links.hold = [this](const std::string& model) {
      held_.push_back("hold " + model);
      return true;
    };
    links.release = [this](const std::string& model) { held_.push_back("release " + model); };
    service_ = std::make_unique<IntegrityService>(
        IntegrityService::Options{.scrub = {std::chrono::milliseconds(0), 0},
                                  .reload_interval = std::chrono::minutes(10)},
        backend_->kind(), registry_, *models_, *admission_, *access_, std::move(links), nullptr,
        [this](const std::string& model, size_t segment, std::vector<uint64_t>* chunks) {
          if (model == "m" && segment == 0 && !chunks->empty() && corrupt_next_.exchange(false)) {
            (*chunks)[0] ^= 1;
          }
        });
  }
  void TearDown() override {
    service_->Stop();
    StopParts();
  }
  // A ready entry of "m", loaded from its checkpoint (and digested on the way).
  std::shared_ptr<cache::Entry> Loaded() {
    auto opened = models_->Open("m", /*refresh=*/false);
    EXPECT_TRUE(opened.ok()) << opened.status();
    const Admission::AskedEnv placed = admission_->Placed(0);
    auto e = admission_->StartLoad(*opened, spec::Layout{}, placed.env, placed.device_uuid);
    EXPECT_TRUE(e.ok()) << e.status();
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    EXPECT_TRUE(registry_.WaitReady(*e, deadline, nullptr).ok());
    return *e;
  }
  absl::StatusOr<v1::VerifyResidentResponse> Verify(uid_t uid, const std::string& model = "m") {
    v1::VerifyResidentRequest req;
    req.set_model(model);
    v1::VerifyResidentResponse resp;
    WC_RETURN_IF_ERROR(service_->VerifyResident(On(uid), req, &resp));
    return resp;
  }

  std::vector<std::pair<std::string, std::string>> told_;
  std::vector<std::string> held_;
  std::atomic<bool> corrupt_next_{false};
  std::unique_ptr<IntegrityService> service_;
};

TEST_F(IntegrityServiceTest, AnAdminVerifiesAReadyEntryCleanAndOthersAreRefused) {
  const auto e = Loaded();
  auto clean = Verify(kAdmin);
  ASSERT_TRUE(clean.ok()) << clean.status();
  ASSERT_EQ(clean->entries_size(), 1);
  EXPECT_EQ(clean->entries(0).result(), "clean");
  EXPECT_EQ(clean->entries(0).fingerprint(), e->fingerprint);
  EXPECT_GT(clean->entries(0).bytes(), 0u);
  EXPECT_EQ(Verify(0).status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(Verify(kAdmin, "other").status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(told_.empty());
}

TEST_F(IntegrityServiceTest, AChangedEntryLeavesServiceItsHolderIsToldAndACleanCopyLoads) {
  const auto e = Loaded();
  cache::LeaseRecord lease;
  lease.id = "lease-1";
  lease.since = std::chrono::steady_clock::now();
  ASSERT_TRUE(registry_.AddLease(e, lease).ok());

  corrupt_next_ = true;
  auto found = Verify(kAdmin);
  ASSERT_TRUE(found.ok()) << found.status();
  ASSERT_EQ(found->entries_size(), 1);
  EXPECT_EQ(found->entries(0).result(), "corrupt");
  EXPECT_NE(registry_.StateOf(e), cache::State::kReady);  // out of service

  ASSERT_EQ(told_.size(), 1u);
  EXPECT_EQ(told_[0].first, "lease-1");
  EXPECT_THAT(told_[0].second, HasSubstr(kEventCorrupt));
  // Acquires by the name were held from the finding until the clean copy's load was in.
  EXPECT_EQ(held_, std::vector<std::string>({"hold m", "release m"}));

  // The clean copy: another entry of the same model and fingerprint, loaded from disk.
  std::shared_ptr<cache::Entry> clean;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (clean == nullptr && std::chrono::steady_clock::now() < until) {
    for (const auto& r : registry_.ReadyEntries()) {
      if (r != e && r->model == "m") clean = r;
    }
    if (clean == nullptr) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_NE(clean, nullptr);
  EXPECT_EQ(clean->fingerprint, e->fingerprint);
  auto again = Verify(kAdmin);
  ASSERT_TRUE(again.ok()) << again.status();
  ASSERT_EQ(again->entries_size(), 1);
  EXPECT_EQ(again->entries(0).result(), "clean");
}

// Issue 48: an entry found corrupt with no lease on it goes straight to gone; it used to
// leave no trace an admin could read (Status listed nothing). Now a finding names it, the
// segment and bytes, and the clean copy being loaded.
TEST_F(IntegrityServiceTest, AnUnleasedCorruptEntryIsRecordedForAdminsAndReloaded) {
  const auto e = Loaded();
  corrupt_next_ = true;
  auto found = Verify(kAdmin);
  ASSERT_TRUE(found.ok()) << found.status();
  ASSERT_EQ(found->entries(0).result(), "corrupt");
  EXPECT_EQ(registry_.StateOf(e), cache::State::kGone);  // no lease: gone at once
  EXPECT_TRUE(told_.empty());

  v1::StatusResponse st;
  service_->AppendFindings(&st);
  ASSERT_EQ(st.integrity_findings_size(), 1);
  const auto& f = st.integrity_findings(0);
  EXPECT_EQ(f.model(), "m");
  EXPECT_EQ(f.fingerprint(), e->fingerprint);
  EXPECT_EQ(f.device_uuid(), e->device_uuid);
  EXPECT_THAT(f.detail(), HasSubstr("segment 0 of"));
  EXPECT_THAT(f.detail(), HasSubstr("bytes [0, 1048576) changed"));
  EXPECT_EQ(f.was(), "ready");
  EXPECT_EQ(f.leases_told(), 0u);
  EXPECT_THAT(f.reload(), HasSubstr("loading a clean copy"));
  EXPECT_GE(f.seconds_ago(), 0);
  EXPECT_EQ(registry_.FindByModel("m").size(), 1u);  // the clean copy's load
}

// Issue 48: a model found corrupt again within --corrupt_reload_interval (10 minutes here) is
// not reloaded, and the finding says why. It used to reload every time, and each reload may
// evict other tenants' unleased entries for the budget.
TEST_F(IntegrityServiceTest, AModelCorruptAgainWithinTheIntervalIsNotReloaded) {
  const auto first = Loaded();
  corrupt_next_ = true;
  ASSERT_EQ(Verify(kAdmin)->entries(0).result(), "corrupt");
  std::shared_ptr<cache::Entry> copy;
  for (const auto& c : registry_.FindByModel("m")) copy = c;
  ASSERT_NE(copy, nullptr);
  ASSERT_TRUE(
      registry_.WaitReady(copy, std::chrono::steady_clock::now() + std::chrono::seconds(30)).ok());

  corrupt_next_ = true;
  ASSERT_EQ(Verify(kAdmin)->entries(0).result(), "corrupt");
  EXPECT_TRUE(registry_.FindByModel("m").empty());  // no second load
  v1::StatusResponse st;
  service_->AppendFindings(&st);
  ASSERT_EQ(st.integrity_findings_size(), 2);
  EXPECT_THAT(st.integrity_findings(1).reload(), HasSubstr("found corrupt again"));
  EXPECT_THAT(st.integrity_findings(1).reload(), HasSubstr("at most one reload per 600 s"));
  // Acquires by the name were held and released both times (none waits for a load that
  // never comes).
  EXPECT_EQ(held_, std::vector<std::string>({"hold m", "release m", "hold m", "release m"}));
}

}  // namespace
}  // namespace weightcache::server
