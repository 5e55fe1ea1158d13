#include "pkg/client/client.h"

#include <cstdlib>

#include "gtest/gtest.h"
#include "tests/testutil/temp_dir.h"

namespace weightcache::client {
namespace {

TEST(AcquireOptions, FromEnvironmentReadsTheModelAnnotation) {
  ::setenv(kModelEnv, "llama-8b", 1);
  auto o = AcquireOptions::FromEnvironment();
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->model, "llama-8b");
}

TEST(AcquireOptions, MissingModelAnnotationSaysHowToSetIt) {
  for (const char* value : {static_cast<const char*>(nullptr), ""}) {
    if (value == nullptr) {
      ::unsetenv(kModelEnv);
    } else {
      ::setenv(kModelEnv, value, 1);
    }
    auto o = AcquireOptions::FromEnvironment();
    ASSERT_EQ(o.status().code(), absl::StatusCode::kInvalidArgument);
    std::string msg(o.status().message());
    EXPECT_NE(msg.find("WEIGHTCACHE_MODEL is not set"), std::string::npos) << msg;
    EXPECT_NE(msg.find("weightcache.io/model"), std::string::npos) << msg;
  }
}

TEST(AcquireOptions, FingerprintFromTheEnvironmentWinsOverTheModel) {
  ::setenv(kModelEnv, "llama-8b", 1);
  ::setenv(kFingerprintEnv, "ab12", 1);
  auto o = AcquireOptions::FromEnvironment();
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->fingerprint, "ab12");
  EXPECT_EQ(o->model, "");  // one target: the daemon takes a model or a fingerprint
  ::unsetenv(kModelEnv);
  o = AcquireOptions::FromEnvironment();
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->fingerprint, "ab12");
  ::setenv(kFingerprintEnv, "", 1);  // empty: as if unset
  ::setenv(kModelEnv, "llama-8b", 1);
  o = AcquireOptions::FromEnvironment();
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->model, "llama-8b");
  EXPECT_EQ(o->fingerprint, "");
  ::unsetenv(kFingerprintEnv);
  ::unsetenv(kModelEnv);
  o = AcquireOptions::FromEnvironment();
  ASSERT_EQ(o.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(o.status().message().find("(nor WEIGHTCACHE_FINGERPRINT)"), absl::string_view::npos)
      << o.status();
}

TEST(Client, ConnectNamesTheMissingSocketFromTheEnvironment) {
  testing::TempDir dir;
  ::setenv(kSocketEnv, (dir / "nope.sock").c_str(), 1);
  auto c = Client::Connect();
  ASSERT_EQ(c.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(c.status().message().find(dir / "nope.sock"), absl::string_view::npos) << c.status();
  ::unsetenv(kSocketEnv);
}

TEST(Client, AcquireWithoutTargetIsRejectedLocally) {
  testing::TempDir dir;
  // A directory argument means its control.sock; the channel connects lazily.
  std::string sock = dir / "control.sock";
  FILE* f = std::fopen(sock.c_str(), "w");
  std::fclose(f);
  auto c = Client::Connect(dir.path());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ((*c)->socket_path(), sock);
  auto lease = (*c)->Acquire(AcquireOptions{});
  EXPECT_EQ(lease.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace weightcache::client
