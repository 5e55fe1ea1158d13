// CheckOptions: each option an operator can mistype is refused naming its flag and why; the
// defaults and what is meant (no budget, equal caps) pass.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "pkg/server/options.h"
#include "tests/testutil/temp_dir.h"

namespace weightcache::server {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

std::string Refusal(const DaemonOptions& o) {
  const absl::Status s = CheckOptions(o);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  return std::string(s.message());
}

TEST(CheckOptions, TheDefaultsAndAbsolutePathsPass) {
  testing::TempDir dir;
  DaemonOptions o;
  EXPECT_TRUE(CheckOptions(o).ok());
  o.model_roots = {dir.path(), "/"};
  o.keeper_socket = "/run/weightcache-keeper/keeper.sock";
  o.namespace_rules.container_socket_dir = "/run/weightcache";
  o.artifact_dir = dir / "artifacts";  // made at start; need not exist yet
  o.namespace_rules.cache_ttl = std::chrono::milliseconds(0);
  EXPECT_TRUE(CheckOptions(o).ok()) << CheckOptions(o);
}

TEST(CheckOptions, AModelRootThatDoesNotExistIsRefused) {
  testing::TempDir dir;
  DaemonOptions o;
  o.model_roots = {dir.path(), dir / "nonexistent"};
  EXPECT_THAT(Refusal(o), AllOf(HasSubstr("--model_roots=" + dir / "nonexistent"),
                                HasSubstr("No such file or directory")));
  std::ofstream(dir / "file") << "x";
  o.model_roots = {dir / "file"};
  EXPECT_THAT(Refusal(o), HasSubstr("--model_roots=" + dir / "file" + ": not a directory"));
}

TEST(CheckOptions, ARelativeModelRootIsRefused) {
  DaemonOptions o;
  o.model_roots = {"models"};
  EXPECT_THAT(Refusal(o), HasSubstr("--model_roots=models: a relative path"));
  o.model_roots = {""};
  EXPECT_THAT(Refusal(o), HasSubstr("--model_roots: an empty entry"));
}

TEST(CheckOptions, ARelativeKeeperSocketIsRefused) {
  DaemonOptions o;
  o.keeper_socket = "keeper.sock";
  EXPECT_THAT(Refusal(o), AllOf(HasSubstr("--keeper_socket=keeper.sock: a relative path"),
                                HasSubstr("must be absolute")));
}

TEST(CheckOptions, ARelativeContainerSocketDirIsRefused) {
  DaemonOptions o;
  o.namespace_rules.container_socket_dir = "run/weightcache";
  EXPECT_THAT(Refusal(o), HasSubstr("--container_socket_dir=run/weightcache: a relative path"));
}

TEST(CheckOptions, ARelativeArtifactDirIsRefused) {
  DaemonOptions o;
  o.artifact_dir = "./artifacts";
  EXPECT_THAT(Refusal(o), HasSubstr("--artifact_dir=./artifacts: a relative path"));
}

TEST(CheckOptions, APodResourcesCacheOutsideZeroToAnHourIsRefused) {
  DaemonOptions o;
  o.namespace_rules.cache_ttl = std::chrono::milliseconds(-1000);
  EXPECT_THAT(Refusal(o), HasSubstr("--pod_resources_cache=-1: must be in [0, 3600] seconds"));
  o.namespace_rules.cache_ttl = std::chrono::milliseconds(3600001);
  EXPECT_THAT(Refusal(o), HasSubstr("--pod_resources_cache=3600"));
  o.namespace_rules.cache_ttl = std::chrono::milliseconds(3600000);
  EXPECT_TRUE(CheckOptions(o).ok());
}

TEST(CheckOptions, AnArtifactLimitOfZeroIsRefusedUnlessNoArtifactsAreKept) {
  DaemonOptions o;
  o.artifact_max_bytes = 0;
  EXPECT_THAT(Refusal(o), AllOf(HasSubstr("--artifact_max_bytes=0: every artifact put would be "
                                          "refused"),
                                HasSubstr("1073741824 bytes")));
  o.artifact_budget_bytes = 0;  // no artifacts at all: the limit says nothing
  EXPECT_TRUE(CheckOptions(o).ok());
}

TEST(CheckOptions, AnArtifactLimitAboveTheBudgetIsRefused) {
  DaemonOptions o;
  o.artifact_budget_bytes = 1 << 20;
  o.artifact_max_bytes = (1 << 20) + 1;
  EXPECT_THAT(Refusal(o), HasSubstr("--artifact_max_bytes (1048577 bytes) is above "
                                    "--artifact_budget (1048576 bytes)"));
  o.artifact_max_bytes = 1 << 20;  // one artifact as large as the budget: meant
  EXPECT_TRUE(CheckOptions(o).ok());
}

// A pod's share of the artifact budget above half of it: the pods' part (the budget less one
// share, kept for the admin's puts) would not hold one share. Half is meant; the default
// (0) is a quarter.
TEST(CheckOptions, APodsArtifactShareAboveHalfTheBudgetIsRefused) {
  DaemonOptions o;
  o.artifact_budget_bytes = 4 << 20;
  o.artifact_max_bytes = 1 << 20;
  o.artifact_reserve_per_unit_bytes = (2 << 20) + 1;
  EXPECT_THAT(Refusal(o), AllOf(HasSubstr("--artifact_reserve_per_unit (2097153 bytes) is above "
                                          "half of --artifact_budget (4194304 bytes)"),
                                HasSubstr("give at most 2097152 bytes")));
  o.artifact_reserve_per_unit_bytes = 2 << 20;
  EXPECT_TRUE(CheckOptions(o).ok());
  o.artifact_reserve_per_unit_bytes = 0;
  EXPECT_TRUE(CheckOptions(o).ok());
  EXPECT_EQ(ArtifactReservePerUnit(o), 1u << 20);
}

// A per-pod cap above its total never binds (one pod could take all): refused; equal is meant.
TEST(CheckOptions, APerPodCapAboveItsTotalIsRefused) {
  struct Case {
    size_t DaemonOptions::*total;
    size_t DaemonOptions::*per_pod;
    const char* message;
  };
  for (const Case& c :
       {Case{&DaemonOptions::max_connections, &DaemonOptions::max_connections_per_pod,
             "--max_connections (4) is below --max_connections_per_pod (5)"},
        Case{&DaemonOptions::artifact_max_puts, &DaemonOptions::artifact_max_puts_per_unit,
             "--artifact_max_puts_per_unit (5) is above --artifact_max_puts (4)"}}) {
    DaemonOptions o;
    o.*c.total = 4;
    o.*c.per_pod = 5;
    EXPECT_THAT(Refusal(o), HasSubstr(c.message));
    o.*c.per_pod = 4;
    EXPECT_TRUE(CheckOptions(o).ok()) << c.message;
  }
  DaemonOptions o;
  o.artifact_max_puts = 0;
  EXPECT_THAT(Refusal(o), HasSubstr("--artifact_max_puts=0"));
}

}  // namespace
}  // namespace weightcache::server
