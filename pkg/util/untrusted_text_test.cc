#include "pkg/util/untrusted_text.h"

#include <string>

#include "gtest/gtest.h"

namespace weightcache {
namespace {

TEST(QuoteTruncatedTest, EscapesControlCharactersAndQuotes) {
  EXPECT_EQ(QuoteTruncated(std::string("q_proj\0x", 8)), R"("q_proj\000x")");
  EXPECT_EQ(QuoteTruncated("a\"b\nc"), R"("a\"b\nc")");
  EXPECT_EQ(EscapeTruncated("it's"), R"(it\'s)");
}

TEST(QuoteTruncatedTest, CutsLongInputAndSaysHowLong) {
  const std::string huge(1'000'000, 'a');
  const std::string q = QuoteTruncated(huge);
  EXPECT_EQ(q, "\"" + std::string(kMaxQuotedBytes, 'a') + "...\" (1000000 bytes)");
  EXPECT_EQ(QuoteTruncated("abcdef", 3), R"("abc..." (6 bytes))");
  EXPECT_EQ(QuoteTruncated("abc", 3), R"("abc")");
}

TEST(BracketNestingDepthTest, CountsBracketsOutsideStrings) {
  EXPECT_EQ(BracketNestingDepth("1", 10), 0u);
  EXPECT_EQ(BracketNestingDepth(R"({"a":[1,{"b":[]}]})", 10), 4u);
  EXPECT_EQ(BracketNestingDepth(R"({"a":"[[[[\"[[["})", 10), 1u);
  EXPECT_EQ(BracketNestingDepth(R"([[]] [[[]]])", 10), 3u);
  // YAML: single-quoted strings and comments do not count.
  EXPECT_EQ(BracketNestingDepth("a: '[[it''s [['\nb: [1] # [[[[\nc: {d: [x]}", 10), 2u);
  EXPECT_EQ(BracketNestingDepth("a#[[: [b]", 10), 3u);  // '#' inside a word is no comment
}

TEST(BracketNestingDepthTest, StopsJustAboveTheLimit) {
  const std::string deep(900 * 1024, '[');
  EXPECT_EQ(BracketNestingDepth(deep, 64), 65u);
}

}  // namespace
}  // namespace weightcache
