// Acquire on its own (acquire_service.h): the core's parts on the host backend, a lease
// manager and (empty) preloads, no daemon and no sockets. Each answer's result as the metrics
// count it: a load on a miss, a hit, a miss that names what is cached, a mismatch explained,
// a stale entry, requests that name nothing.
#include "pkg/server/internal/acquire_service.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "pkg/safetensors/writer.h"
#include "pkg/server/testing/core_parts.h"

namespace weightcache::server {
namespace {

using metrics::AcquireResult;
using ::testing::HasSubstr;
using testing::On;

class AcquireServiceTest : public testing::CorePartsTest {
 protected:
  void SetUp() override {
    MakeParts();
    leases_ = std::make_unique<LeaseManager>(&registry_, std::chrono::seconds(10));
    preloads_ = std::make_unique<Preloads>(std::vector<spec::ModelSpec>{}, *models_, *admission_,
                                           *access_, nullptr);
    service_ = std::make_unique<AcquireService>(
        AcquireService::Options{.handle_socket = "/run/wc/handle.sock"}, registry_, *models_,
        *admission_, *access_, *leases_, *preloads_);
  }
  void TearDown() override {
    service_.reset();
    StopParts();
  }
  struct Answer {
    absl::Status status;
    AcquireResult result;
    std::string model;
    v1::AcquireResponse resp;
  };
  Answer Acquire(const v1::AcquireRequest& req) {
    Answer a;
    a.status = service_->Acquire(On(0), req, &a.resp, &a.model, &a.result);
    return a;
  }
  static v1::AcquireRequest ByName(bool load_on_miss = false) {
    v1::AcquireRequest req;
    req.set_model("m");
    req.set_load_on_miss(load_on_miss);
    return req;
  }

  std::unique_ptr<LeaseManager> leases_;
  std::unique_ptr<Preloads> preloads_;
  std::unique_ptr<AcquireService> service_;
};

TEST_F(AcquireServiceTest, AMissLoadsWithLoadOnMissAndTheNextAcquireIsAHit) {
  const Answer miss = Acquire(ByName());
  EXPECT_EQ(miss.status.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(miss.result, AcquireResult::kMiss);
  EXPECT_THAT(std::string(miss.status.message()),
              HasSubstr("is not cached for tp 0/1 on cpu (fingerprint"));  // what was asked

  const Answer loaded = Acquire(ByName(/*load_on_miss=*/true));
  ASSERT_TRUE(loaded.status.ok()) << loaded.status;
  EXPECT_EQ(loaded.result, AcquireResult::kMiss);
  EXPECT_EQ(loaded.model, "m");
  EXPECT_FALSE(loaded.resp.token().empty());
  EXPECT_EQ(loaded.resp.handle_socket(), "/run/wc/handle.sock");
  EXPECT_GT(loaded.resp.tensors_size(), 0);

  v1::AcquireRequest by_fp;
  by_fp.set_fingerprint(loaded.resp.fingerprint());
  by_fp.set_packed_manifest(true);
  const Answer hit = Acquire(by_fp);
  ASSERT_TRUE(hit.status.ok()) << hit.status;
  EXPECT_EQ(hit.result, AcquireResult::kHit);
  EXPECT_EQ(hit.model, "m");  // labelled with the entry's model
  EXPECT_FALSE(hit.resp.tensor_manifest().empty());
  EXPECT_NE(hit.resp.lease_id(), loaded.resp.lease_id());

  const AcquireService::Counts c = service_->counts();
  EXPECT_EQ(c.misses, 2u);
  EXPECT_EQ(c.hits, 1u);
  EXPECT_EQ(c.errors, 0u);
}

TEST_F(AcquireServiceTest, AnotherDtypeIsAMismatchExplainedFieldByField) {
  ASSERT_TRUE(Acquire(ByName(true)).status.ok());
  v1::AcquireRequest req = ByName();
  req.set_dtype("F32");
  const Answer a = Acquire(req);
  EXPECT_EQ(a.status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(a.result, AcquireResult::kMismatch);
  EXPECT_THAT(std::string(a.status.message()), HasSubstr("cached weights do not fit: dtype"));
}

TEST_F(AcquireServiceTest, ACheckpointChangedOnDiskMakesTheCachedEntryStale) {
  const Answer loaded = Acquire(ByName(true));
  ASSERT_TRUE(loaded.status.ok());
  safetensors::LlamaShape other = safetensors::TinyLlama();
  other.seed = 7;  // other bytes, same names and shapes
  ASSERT_TRUE(safetensors::WriteLlamaCheckpoint(dir_ / "m", other).ok());
  const Answer a = Acquire(ByName());
  EXPECT_EQ(a.status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(a.result, AcquireResult::kStale);
  EXPECT_THAT(std::string(a.status.message()), HasSubstr("stale: model 'm'"));
  EXPECT_EQ(service_->counts().stale, 1u);
}

TEST_F(AcquireServiceTest, ARequestNamingNothingOrAnUnknownFingerprintIsAnsweredPlainly) {
  const Answer none = Acquire(v1::AcquireRequest());
  EXPECT_EQ(none.status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(none.result, AcquireResult::kError);
  v1::AcquireRequest fp;
  fp.set_fingerprint("wc1-nothing");
  const Answer unknown = Acquire(fp);
  EXPECT_EQ(unknown.status.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(unknown.result, AcquireResult::kMiss);
  EXPECT_THAT(std::string(unknown.status.message()), HasSubstr("no cached entry has fingerprint"));
  EXPECT_EQ(unknown.model, "");
}

}  // namespace
}  // namespace weightcache::server
