#include "pkg/util/size_flag.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace weightcache {
namespace {

using ::testing::HasSubstr;

TEST(ParseByteSize, BinaryAndDecimalSuffixes) {
  EXPECT_EQ(ParseByteSize("0", "--x").value(), 0u);
  EXPECT_EQ(ParseByteSize("64MiB", "--x").value(), 64ull << 20);
  EXPECT_EQ(ParseByteSize("1.5TB", "--x").value(), 1500000000000ull);
  auto bad = ParseByteSize("12XB", "--memory_budget");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("--memory_budget: '12XB'"));
}

// The chart's default budget is a share of each device (issue 25: no budget by default let
// one pod fill every GPU).
TEST(ParseByteSizeOrShare, APercentageIsAShareOfTheWhole) {
  EXPECT_EQ(ParseByteSizeOrShare("80%", 1000, "--x").value(), 800u);
  EXPECT_EQ(ParseByteSizeOrShare("100%", 1000, "--x").value(), 1000u);
  EXPECT_EQ(ParseByteSizeOrShare("2GiB", 1000, "--x").value(), 2ull << 30);
  for (const char* bad : {"0%", "101%", "%", "x%", "-5%", "50 %x"}) {
    auto r = ParseByteSizeOrShare(bad, 1000, "--memory_budget");
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(std::string(r.status().message()), HasSubstr("--memory_budget: '")) << bad;
  }
}

}  // namespace
}  // namespace weightcache
