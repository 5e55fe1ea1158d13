#include "pkg/server/wire/handle_message.h"

#include <algorithm>

namespace weightcache::server {
namespace {

constexpr std::string_view kMagic = "WCH1 ";

bool IsTokenChar(char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

Handshake Error(std::string message) {
  Handshake h;
  h.state = Handshake::State::kError;
  h.error = std::move(message);
  return h;
}

}  // namespace

Handshake ParseHandshake(std::string_view received) {
  const size_t nl = received.find('\n');
  if (nl == std::string_view::npos) {
    if (received.size() >= kMaxHandshakeLine) return Error("handshake line too long");
    return {};
  }
  if (nl + 1 > kMaxHandshakeLine) return Error("handshake line too long");
  const std::string_view line = received.substr(0, nl);
  if (line.substr(0, kMagic.size()) != kMagic) {
    return Error("bad handshake: expected 'WCH1 <token>'");
  }
  const std::string_view token = line.substr(kMagic.size());
  if (token.empty() || token.size() > kMaxTokenLength ||
      !std::all_of(token.begin(), token.end(), IsTokenChar)) {
    return Error("bad handshake: the token must be 1 to 128 ASCII letters and digits");
  }
  Handshake h;
  h.state = Handshake::State::kToken;
  h.token = std::string(token);
  return h;
}

std::string FormatErrorLine(std::string_view message) {
  std::string line = "ERR ";
  line.append(message.substr(0, kMaxErrorLine - line.size() - 1));
  std::replace_if(
      line.begin(), line.end(),
      [](char c) { return static_cast<unsigned char>(c) < 0x20 || c == 0x7F; }, ' ');
  line.push_back('\n');
  return line;
}

std::string FormatEventLine(std::string_view kind, std::string_view message) {
  std::string line = "EVENT ";
  line.append(kind);
  line.push_back(' ');
  line.append(message.substr(0, kMaxHandshakeLine - std::min(line.size() + 1, kMaxHandshakeLine)));
  std::replace_if(
      line.begin(), line.end(),
      [](char c) { return static_cast<unsigned char>(c) < 0x20 || c == 0x7F; }, ' ');
  line.push_back('\n');
  return line;
}

}  // namespace weightcache::server
