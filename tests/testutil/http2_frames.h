// HTTP/2 frames written by hand for tests that must behave as no real client does (streams
// opened and never used): RFC 9113 frame headers and an RFC 7541 header block of literals.
#pragma once

#include <cstdint>
#include <string>

namespace weightcache::testing {

inline constexpr char kHttp2Preface[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
inline constexpr uint8_t kHttp2Headers = 0x1;
inline constexpr uint8_t kHttp2RstStream = 0x3;
inline constexpr uint8_t kHttp2Settings = 0x4;
inline constexpr uint8_t kHttp2Continuation = 0x9;
inline constexpr uint8_t kHttp2EndStream = 0x1;
inline constexpr uint8_t kHttp2EndHeaders = 0x4;

inline void AppendHttp2Frame(std::string& out, uint8_t type, uint8_t flags, uint32_t stream,
                             const std::string& payload) {
  const size_t len = payload.size();
  out += static_cast<char>((len >> 16) & 0xff);
  out += static_cast<char>((len >> 8) & 0xff);
  out += static_cast<char>(len & 0xff);
  out += static_cast<char>(type);
  out += static_cast<char>(flags);
  for (int shift = 24; shift >= 0; shift -= 8) out += static_cast<char>((stream >> shift) & 0xff);
  out += payload;
}

// The header block of a gRPC request for `path`: static-table :method POST and :scheme http,
// literal values without indexing for the rest (all shorter than 127 bytes, no Huffman).
inline std::string GrpcRequestHeaderBlock(const std::string& path) {
  std::string b;
  auto literal = [&b](uint8_t name_index, const std::string& name, const std::string& value) {
    if (name_index == 0) {
      b += '\0';
      b += static_cast<char>(name.size());
      b += name;
    } else if (name_index < 15) {
      b += static_cast<char>(name_index);
    } else {
      b += '\x0f';
      b += static_cast<char>(name_index - 15);
    }
    b += static_cast<char>(value.size());
    b += value;
  };
  b += '\x83';  // :method POST
  b += '\x86';  // :scheme http
  literal(4, ":path", path);
  literal(1, ":authority", "localhost");
  literal(31, "content-type", "application/grpc");
  literal(0, "te", "trailers");
  return b;
}

}  // namespace weightcache::testing
