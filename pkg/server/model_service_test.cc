// The model verbs on their own (model_service.h): host backend, a real registry, catalog,
// admission and access, no daemon. Load's progress to ready, an inline spec defined only by a
// Load that succeeds, Evict's roles and answers; and the catalog's rule for what the keeper
// kept.
#include "pkg/server/internal/model_service.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "pkg/memory/backend.h"
#include "pkg/safetensors/writer.h"
#include "pkg/server/testing/core_parts.h"

namespace weightcache::server {
namespace {

using ::testing::HasSubstr;

using testing::kAdmin;
using testing::On;

class ModelServiceTest : public testing::CorePartsTest {
 protected:
  void SetUp() override {
    MakeParts();
    service_ = std::make_unique<ModelService>(ModelService::Options{}, backend_.get(), registry_,
                                              *models_, *admission_, *access_);
  }
  void TearDown() override { StopParts(); }
  // A Load's status and the states it reported, in order.
  absl::Status Load(uid_t uid, const v1::LoadRequest& req, std::vector<std::string>* states) {
    return service_->Load(On(uid), req, [states](const v1::LoadProgress& p) {
      states->push_back(p.state());
      return true;
    });
  }
  std::string InlineSpec(const std::string& name, const std::string& dir) {
    return "models:\n  - name: " + name + "\n    model_dir: " + dir + "\n";
  }

  std::unique_ptr<ModelService> service_;
};

TEST_F(ModelServiceTest, AnEngineLoadsAKnownModelAndHearsItsProgressUntilReady) {
  v1::LoadRequest req;
  req.set_model("m");
  std::vector<std::string> states;
  ASSERT_TRUE(Load(0, req, &states).ok());
  ASSERT_FALSE(states.empty());
  EXPECT_EQ(states.back(), "ready");
  EXPECT_EQ(registry_.ReadyEntries().size(), 1u);
  v1::LoadRequest none;
  EXPECT_EQ(Load(0, none, &states).code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(ModelServiceTest, AnInlineSpecIsAnAdminsAndDefinedOnlyByALoadThatSucceeds) {
  v1::LoadRequest req;
  req.set_spec_yaml(InlineSpec("inline", dir_ / "m"));
  std::vector<std::string> states;
  EXPECT_EQ(Load(0, req, &states).code(), absl::StatusCode::kPermissionDenied);
  EXPECT_FALSE(models_->Spec("inline").has_value());

  v1::LoadRequest broken;
  broken.set_spec_yaml(InlineSpec("broken", dir_ / "no-such-dir"));
  EXPECT_FALSE(Load(kAdmin, broken, &states).ok());
  EXPECT_FALSE(models_->Spec("broken").has_value());  // restored: undefined again

  ASSERT_TRUE(Load(kAdmin, req, &states).ok());
  EXPECT_TRUE(models_->Spec("inline").has_value());
  EXPECT_TRUE(models_->DefinedInline("inline"));
}

TEST_F(ModelServiceTest, OnlyAnAdminEvictsAndAnEvictThatFindsNothingSaysSo) {
  v1::LoadRequest load;
  load.set_model("m");
  std::vector<std::string> states;
  ASSERT_TRUE(Load(0, load, &states).ok());
  v1::EvictRequest req;
  req.set_model("m");
  v1::EvictResponse resp;
  EXPECT_EQ(service_->Evict(On(0), req, &resp).code(), absl::StatusCode::kPermissionDenied);
  ASSERT_TRUE(service_->Evict(On(kAdmin), req, &resp).ok());
  EXPECT_EQ(resp.evicted(), 1u);
  const absl::Status again = service_->Evict(On(kAdmin), req, &resp);
  EXPECT_EQ(again.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(again.message()), HasSubstr("nothing to evict for model 'm'"));
  v1::EvictRequest empty;
  EXPECT_EQ(service_->Evict(On(kAdmin), empty, &resp).code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(ModelServiceTest, TheKeepersEntriesComeBackOnlyUnderTheCurrentConfiguration) {
  EXPECT_TRUE(models_->AdmitKept("m", dir_ / "m", false, "").ok());
  const absl::Status moved = models_->AdmitKept("m", "/elsewhere", false, "");
  EXPECT_EQ(moved.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(moved.message()), HasSubstr("is now configured with model_dir"));
  const absl::Status revoked = models_->AdmitKept("gone", dir_ / "m", false, "");
  EXPECT_EQ(revoked.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(revoked.message()), HasSubstr("revoked"));
  ASSERT_TRUE(
      models_->AdmitKept("inline", dir_ / "m", true, InlineSpec("inline", dir_ / "m")).ok());
  EXPECT_TRUE(models_->Spec("inline").has_value());
  EXPECT_EQ(models_->AdmitKept("other", dir_ / "m", true, InlineSpec("inline", dir_ / "m")).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace weightcache::server
