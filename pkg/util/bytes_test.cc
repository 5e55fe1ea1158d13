#include "pkg/util/bytes.h"

#include <string>

#include "gtest/gtest.h"

namespace weightcache {
namespace {

TEST(RoundUp, RoundsToTheNextMultipleAndKeepsMultiples) {
  EXPECT_EQ(RoundUp(0, 4096), 0u);
  EXPECT_EQ(RoundUp(1, 4096), 4096u);
  EXPECT_EQ(RoundUp(4096, 4096), 4096u);
  EXPECT_EQ(RoundUp(4097, 4096), 8192u);
  EXPECT_EQ(RoundUp(7, 1), 7u);
  EXPECT_EQ(RoundUp((uint64_t{1} << 40) + 3, uint64_t{2} << 20), (uint64_t{1} << 40) + (2 << 20));
  static_assert(RoundUp(100, 64) == 128);
}

TEST(HexEncode, TwoLowerCaseDigitsAByte) {
  const unsigned char b[] = {0x00, 0x01, 0x7f, 0x80, 0xab, 0xff};
  EXPECT_EQ(HexEncode(b, sizeof(b)), "00017f80abff");
  EXPECT_EQ(HexEncode(b, 0), "");
  const std::string s = "weightcache";
  EXPECT_EQ(HexEncode(s.data(), s.size()), "7765696768746361636865");
}

}  // namespace
}  // namespace weightcache
