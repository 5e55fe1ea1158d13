// Preloads on their own (preloads.h): host backend, a real registry, catalog, admission and
// access, no daemon. Names pending until their loads are registered, waits that end, a spec
// that cannot be opened never left pending, and the shutdown.
#include "pkg/server/internal/preloads.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "pkg/memory/backend.h"
#include "pkg/safetensors/writer.h"
#include "pkg/server/testing/core_parts.h"

namespace weightcache::server {
namespace {

using ::testing::HasSubstr;

class PreloadsTest : public testing::CorePartsTest {
 protected:
  void SetUp() override {
    spec::ModelSpec missing;
    missing.name = "missing";
    missing.model_dir = dir_ / "no-such-dir";
    MakeParts({missing});
    preloads_ = std::make_unique<Preloads>(options_.specs, *models_, *admission_, *access_,
                                           [this](const std::string& model) {
                                             if (model == "m") opened_.wait();
                                           });
  }
  void TearDown() override {
    if (!released_) open_.set_value();
    preloads_.reset();
    StopParts();
  }
  void ReleaseOpen() {
    released_ = true;
    open_.set_value();
  }
  static std::chrono::steady_clock::time_point In(std::chrono::seconds s) {
    return std::chrono::steady_clock::now() + s;
  }

  std::promise<void> open_;
  std::shared_future<void> opened_ = open_.get_future().share();
  bool released_ = false;
  std::unique_ptr<Preloads> preloads_;
};

TEST_F(PreloadsTest, ANameIsPendingUntilItsLoadIsRegisteredAndWaitersGoOnThen) {
  preloads_->MarkPending();
  EXPECT_EQ(preloads_->pending(), (std::set<std::string>{"m", "missing"}));
  const absl::Status now = preloads_->Await("m", /*wait=*/false, In(std::chrono::seconds(5)), {});
  EXPECT_EQ(now.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(now.message()), HasSubstr("being opened for its preload"));
  EXPECT_TRUE(preloads_->Await("other", false, In(std::chrono::seconds(5)), {}).ok());

  preloads_->Start();
  // "missing" cannot be opened: it is logged and not left pending; "m" is held in its opening.
  EXPECT_TRUE(preloads_->Await("missing", true, In(std::chrono::seconds(30)), {}).ok());
  auto waiter = std::async(std::launch::async, [this] {
    return preloads_->Await("m", true, In(std::chrono::seconds(30)), {});
  });
  EXPECT_EQ(waiter.wait_for(std::chrono::milliseconds(50)), std::future_status::timeout);
  ReleaseOpen();
  EXPECT_TRUE(waiter.get().ok());
  EXPECT_TRUE(preloads_->pending().empty());
  ASSERT_EQ(preloads_->started().size(), 1u);
  EXPECT_NE(registry_.Find(preloads_->started()[0]), nullptr);
}

TEST_F(PreloadsTest, AHeldNameWaitsLikeAPreloadAndAGoneCallerStopsWaiting) {
  EXPECT_TRUE(preloads_->Hold("m"));
  EXPECT_FALSE(preloads_->Hold("m"));  // held already: the second holder does not release
  const absl::Status gone =
      preloads_->Await("m", true, In(std::chrono::seconds(30)), [] { return true; });
  EXPECT_EQ(gone.code(), absl::StatusCode::kCancelled);
  const absl::Status late = preloads_->Await("m", true, In(std::chrono::seconds(0)), {});
  EXPECT_EQ(late.code(), absl::StatusCode::kUnavailable);
  preloads_->Release("m");
  EXPECT_TRUE(preloads_->Await("m", false, In(std::chrono::seconds(5)), {}).ok());
}

TEST_F(PreloadsTest, AWaitInProgressAtShutdownIsToldToAskAgain) {
  preloads_->MarkPending();
  auto waiter = std::async(std::launch::async, [this] {
    return preloads_->Await("m", true, In(std::chrono::seconds(30)), {});
  });
  EXPECT_EQ(waiter.wait_for(std::chrono::milliseconds(50)), std::future_status::timeout);
  preloads_->Stop();
  const absl::Status s = waiter.get();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(s.message()), HasSubstr("began shutting down"));
}

}  // namespace
}  // namespace weightcache::server
