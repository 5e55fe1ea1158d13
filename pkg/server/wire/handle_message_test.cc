#include "pkg/server/wire/handle_message.h"

#include <string>

#include "gtest/gtest.h"

namespace weightcache::server {
namespace {

using State = Handshake::State;

TEST(ParseHandshakeTest, WellFormedLineGivesTheToken) {
  const Handshake h = ParseHandshake("WCH1 0123abcdef\n");
  EXPECT_EQ(h.state, State::kToken);
  EXPECT_EQ(h.token, "0123abcdef");
  EXPECT_EQ(ParseHandshake("WCH1 " + std::string(128, 'f') + "\n").token, std::string(128, 'f'));
}

TEST(ParseHandshakeTest, PartialLineAsksForMore) {
  EXPECT_EQ(ParseHandshake("").state, State::kIncomplete);
  EXPECT_EQ(ParseHandshake("WCH1 abc").state, State::kIncomplete);
  EXPECT_EQ(ParseHandshake(std::string(kMaxHandshakeLine - 1, 'a')).state, State::kIncomplete);
}

TEST(ParseHandshakeTest, LongLineIsRefusedWithOrWithoutNewline) {
  Handshake h = ParseHandshake(std::string(kMaxHandshakeLine, 'a'));
  EXPECT_EQ(h.state, State::kError);
  EXPECT_EQ(h.error, "handshake line too long");
  // Two reads can buffer more than one line's worth before the '\n' arrives.
  h = ParseHandshake("WCH1 " + std::string(300, 'a') + "\n");
  EXPECT_EQ(h.state, State::kError);
  EXPECT_EQ(h.error, "handshake line too long");
}

TEST(ParseHandshakeTest, BadMagicOrTokenIsRefused) {
  Handshake h = ParseHandshake("HELLO\n");
  EXPECT_EQ(h.state, State::kError);
  EXPECT_EQ(h.error, "bad handshake: expected 'WCH1 <token>'");
  const std::string lines[] = {"WCH1 \n", std::string("WCH1 ab\0cd\n", 11), "WCH1 ab cd\n",
                               "WCH1 ab\rcd\n", "WCH1 " + std::string(129, 'a') + "\n"};
  for (const std::string& line : lines) {
    h = ParseHandshake(line);
    EXPECT_EQ(h.state, State::kError) << line;
    EXPECT_EQ(h.error, "bad handshake: the token must be 1 to 128 ASCII letters and digits");
  }
}

TEST(FormatEventLineTest, OneBoundedLine) {
  EXPECT_EQ(FormatEventLine(kEventCorrupt, "m: bytes [0, 4096)\nchanged"),
            "EVENT corrupt m: bytes [0, 4096) changed\n");
  const std::string long_line = FormatEventLine(kEventCorrupt, std::string(10000, 'x'));
  EXPECT_EQ(long_line.size(), kMaxHandshakeLine);
  EXPECT_EQ(long_line.back(), '\n');
}

TEST(FormatErrorLineTest, OneBoundedLine) {
  EXPECT_EQ(FormatErrorLine("unknown or expired token"), "ERR unknown or expired token\n");
  EXPECT_EQ(FormatErrorLine(std::string("a\nb\0c\x7f", 6)), "ERR a b c \n");
  const std::string line = FormatErrorLine(std::string(100000, 'x'));
  EXPECT_EQ(line.size(), kMaxErrorLine);
  EXPECT_EQ(line.find('\n'), kMaxErrorLine - 1);
}

}  // namespace
}  // namespace weightcache::server
