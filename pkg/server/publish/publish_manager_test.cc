// The publish manager on its own (host backend, a real registry and catalog, no gRPC, no
// sockets): the session's rules — who may claim, commit and abort, a commit that differs from
// its begin, a publisher that goes away, a token never claimed — each leaving no entry behind
// when the publish does not complete.
#include "pkg/server/publish/publish_manager.h"

#include <sys/mman.h>

#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "pkg/cache/registry.h"
#include "pkg/memory/backend.h"
#include "pkg/safetensors/writer.h"
#include "pkg/server/internal/publish_base.h"
#include "pkg/server/testing/core_parts.h"

namespace weightcache::server {
namespace {

using ::testing::HasSubstr;

PeerCred Cred(uid_t uid) { return PeerCred{static_cast<pid_t>(4000 + uid), uid, uid}; }

Caller CallerOf(uid_t uid) {
  Caller c;
  c.cred = Cred(uid);
  return c;
}

class PublishManagerTest : public testing::CorePartsTest {
 protected:
  void SetUp() override {
    options_.acquire_wait = std::chrono::seconds(20);
    MakeParts();
    base_ = std::make_unique<CorePublishBase>(backend_.get(), *admission_, *models_);
    MakePublishes(options_.token_ttl);
  }
  void MakePublishes(std::chrono::seconds token_ttl) {
    publishes_.reset();
    publishes_ = std::make_unique<PublishManager>(
        PublishManager::Options{.token_ttl = token_ttl, .commit_wait = options_.acquire_wait},
        backend_.get(), registry_, *base_, dir_ / "handle.sock");
  }
  void TearDown() override {
    publishes_.reset();  // before the registry (its lifetime rule)
    StopParts();
  }

  static v1::BeginPublishRequest Request(const std::string& recipe, uint64_t floats = 1024) {
    v1::BeginPublishRequest req;
    req.set_model("m");
    req.mutable_env()->set_engine("testengine");
    req.mutable_env()->set_engine_version("1");
    req.mutable_env()->set_recipe(recipe);
    auto* t = req.add_tensors();
    t->set_name("w");
    t->set_dtype("F32");
    t->add_shape(static_cast<int64_t>(floats));
    t->set_nbytes(floats * 4);
    return req;
  }
  static v1::CommitPublishRequest CommitOf(const v1::BeginPublishResponse& begun,
                                           const v1::BeginPublishRequest& req) {
    v1::CommitPublishRequest c;
    c.set_publish_id(begun.publish_id());
    *c.mutable_tensors() = req.tensors();
    return c;
  }
  // Writes `byte` over every claimed segment (mapped writable, then unmapped).
  static void Fill(const HandleChannel::Grant& g, uint8_t byte) {
    for (int fd : g.fds) {
      const off_t size = ::lseek(fd, 0, SEEK_END);
      ASSERT_GT(size, 0);
      void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      ASSERT_NE(p, MAP_FAILED);
      std::memset(p, byte, size);
      ::munmap(p, size);
    }
  }
  // Entries in the registry (any state but gone).
  size_t Entries() const {
    size_t n = 0;
    for (const auto& s : registry_.Snapshot()) n += s.state != cache::State::kGone ? 1 : 0;
    return n;
  }
  // Entries() once it is `n`: an aborted publish's entry goes when its load thread has seen
  // the outcome. Polled, bounded (a limit for the failure case, not a speed).
  size_t EntriesOnce(size_t n) const {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (Entries() != n && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return Entries();
  }

  std::unique_ptr<CorePublishBase> base_;
  std::unique_ptr<PublishManager> publishes_;
};

TEST_F(PublishManagerTest, BeginClaimWriteCommitMakesAReadyEntryWithItsPublisher) {
  const auto req = Request("r1");
  v1::BeginPublishResponse begun;
  ASSERT_TRUE(publishes_->Begin(Cred(1000), "", "", req, &begun).ok());
  ASSERT_FALSE(begun.joined());
  EXPECT_TRUE(publishes_->IsToken(begun.token()));
  EXPECT_EQ(Entries(), 1u) << "a loading entry holds the key and the budget";
  auto grant = publishes_->Claim(begun.token(), Cred(1000), "");
  ASSERT_TRUE(grant.ok()) << grant.status();
  ASSERT_FALSE(grant->fds.empty());
  Fill(*grant, 0x5a);
  v1::CommitPublishResponse committed;
  ASSERT_TRUE(publishes_->Commit(CallerOf(1000), CommitOf(begun, req), &committed).ok());
  EXPECT_EQ(committed.fingerprint(), begun.fingerprint());
  auto e = registry_.Find({begun.fingerprint(), begun.device_uuid()});
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(registry_.StateOf(e), cache::State::kReady);
  auto who = publishes_->PublisherOf(e->key);
  ASSERT_TRUE(who.has_value());
  EXPECT_EQ(who->uid(), 1000);
  EXPECT_EQ(who->recipe(), "r1");
  // The same key again: joined, nothing allocated.
  v1::BeginPublishResponse again;
  ASSERT_TRUE(publishes_->Begin(Cred(1001), "", "", req, &again).ok());
  EXPECT_TRUE(again.joined());
  EXPECT_TRUE(again.token().empty());
}

TEST_F(PublishManagerTest, OnlyTheUidThatBeganMayClaimOnceCommitOrAbortOnItsOwnSocket) {
  const auto req = Request("r2");
  v1::BeginPublishResponse begun;
  ASSERT_TRUE(publishes_->Begin(Cred(1000), "slot-a", "", req, &begun).ok());
  auto other_slot = publishes_->Claim(begun.token(), Cred(1000), "slot-b");
  EXPECT_EQ(other_slot.status().code(), absl::StatusCode::kPermissionDenied);
  auto grant = publishes_->Claim(begun.token(), Cred(1000), "slot-a");
  ASSERT_TRUE(grant.ok()) << "refused claims leave the token valid: " << grant.status();
  EXPECT_FALSE(publishes_->Claim(begun.token(), Cred(1000), "slot-a").ok()) << "claimed twice";
  v1::CommitPublishResponse resp;
  Caller wrong = CallerOf(1001);
  wrong.slot = "slot-a";
  EXPECT_EQ(publishes_->Commit(wrong, CommitOf(begun, req), &resp).code(),
            absl::StatusCode::kPermissionDenied);
  v1::AbortPublishRequest abort;
  abort.set_publish_id(begun.publish_id());
  EXPECT_EQ(publishes_->Abort(Cred(1000), "slot-b", abort).code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(publishes_->Abort(Cred(1000), "slot-a", abort).ok());
  EXPECT_EQ(EntriesOnce(0), 0u);
}

// A token presented by another uid has leaked: it is spent and the publish ends, so the
// writable descriptors never reach anyone but the publisher.
TEST_F(PublishManagerTest, ATokenPresentedByAnotherUidEndsThePublish) {
  v1::BeginPublishResponse begun;
  ASSERT_TRUE(publishes_->Begin(Cred(1000), "", "", Request("r6"), &begun).ok());
  auto stranger = publishes_->Claim(begun.token(), Cred(1001), "");
  EXPECT_EQ(stranger.status().code(), absl::StatusCode::kPermissionDenied) << stranger.status();
  EXPECT_THAT(std::string(stranger.status().message()), HasSubstr("presented by uid 1001"));
  EXPECT_FALSE(publishes_->Claim(begun.token(), Cred(1000), "").ok());
  EXPECT_EQ(EntriesOnce(0), 0u);
}

TEST_F(PublishManagerTest, ACommitThatDiffersFromItsBeginAbortsAndLeavesNothing) {
  const auto req = Request("r3");
  v1::BeginPublishResponse begun;
  ASSERT_TRUE(publishes_->Begin(Cred(1000), "", "", req, &begun).ok());
  ASSERT_TRUE(publishes_->Claim(begun.token(), Cred(1000), "").ok());
  auto commit = CommitOf(begun, Request("r3", 512));
  v1::CommitPublishResponse resp;
  const absl::Status s = publishes_->Commit(CallerOf(1000), commit, &resp);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("tensor 'w'"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("the publish is aborted"));
  EXPECT_EQ(EntriesOnce(0), 0u);
  EXPECT_EQ(publishes_->Commit(CallerOf(1000), CommitOf(begun, req), &resp).code(),
            absl::StatusCode::kNotFound)
      << "an aborted publish cannot be committed";
}

TEST_F(PublishManagerTest, APublisherWhoseConnectionClosesOrNeverClaimsLeavesNothing) {
  v1::BeginPublishResponse closed;
  ASSERT_TRUE(publishes_->Begin(Cred(1000), "", "", Request("r4"), &closed).ok());
  auto grant = publishes_->Claim(closed.token(), Cred(1000), "");
  ASSERT_TRUE(grant.ok()) << grant.status();
  EXPECT_TRUE(publishes_->OnClose(grant->lease_id));  // the handle connection closed
  EXPECT_FALSE(publishes_->OnClose("not-a-publish"));
  EXPECT_EQ(EntriesOnce(0), 0u);

  MakePublishes(std::chrono::seconds(0));  // every unclaimed token has expired
  v1::BeginPublishResponse unclaimed;
  ASSERT_TRUE(publishes_->Begin(Cred(1000), "", "", Request("r5"), &unclaimed).ok());
  EXPECT_EQ(Entries(), 1u);
  publishes_->ExpireTokens();
  EXPECT_EQ(EntriesOnce(0), 0u);
  EXPECT_FALSE(publishes_->IsToken(unclaimed.token()));
}

// The publish RPCs ask the publish rule themselves (their link to Access): a refused caller
// gets the rule's PERMISSION_DENIED from Begin, Commit and Abort, and nothing is registered;
// Begin's weights are the namespace tenant_of names.
TEST_F(PublishManagerTest, TheRpcsAskThePublishRuleAndBeginTakesItsNamespaceFromTheLink) {
  std::vector<std::string> asked;
  publishes_.reset();
  publishes_ = std::make_unique<PublishManager>(
      PublishManager::Options{
          .token_ttl = options_.token_ttl,
          .commit_wait = options_.acquire_wait,
          .authorize =
              [&asked](const Caller& c, const std::string& model) {
                asked.push_back(model);
                return c.cred.uid == 1000 ? absl::OkStatus()
                                          : absl::PermissionDeniedError("rule publish_role");
              },
          .tenant_of = [](const Caller&, const std::string&) -> absl::StatusOr<std::string> {
            return std::string("team-a");
          }},
      backend_.get(), registry_, *base_, dir_ / "handle.sock");
  const auto req = Request("r1");
  v1::BeginPublishResponse refused;
  EXPECT_EQ(publishes_->Begin(CallerOf(0), req, &refused).code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(Entries(), 0u);
  v1::BeginPublishResponse begun;
  ASSERT_TRUE(publishes_->Begin(CallerOf(1000), req, &begun).ok());
  auto snap = registry_.Snapshot();
  ASSERT_EQ(snap.size(), 1u);
  EXPECT_EQ(snap[0].inputs.env.tenant, "team-a");
  v1::CommitPublishResponse committed;
  EXPECT_EQ(publishes_->Commit(CallerOf(0), CommitOf(begun, req), &committed).code(),
            absl::StatusCode::kPermissionDenied);
  v1::AbortPublishRequest abort;
  abort.set_publish_id(begun.publish_id());
  EXPECT_EQ(publishes_->Abort(CallerOf(0), abort).code(), absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(publishes_->Abort(CallerOf(1000), abort).ok());
  EXPECT_THAT(asked, ::testing::ElementsAre("m", "m", "", "", ""));
}

}  // namespace
}  // namespace weightcache::server
