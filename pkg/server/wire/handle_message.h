// The handle channel's wire messages as pure functions (handle_channel.h describes the
// protocol), so that the parsing of what a client sends is testable and fuzzed on its own,
// apart from sockets and the poll loop. Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace weightcache::server {

// Longest handshake line a client may send, '\n' included.
inline constexpr size_t kMaxHandshakeLine = 256;
// Longest token accepted in a handshake (the daemon's are 64 hex digits).
inline constexpr size_t kMaxTokenLength = 128;

struct Handshake {
  enum class State {
    kIncomplete,  // no '\n' yet and still under kMaxHandshakeLine: read more
    kToken,       // a well-formed "WCH1 <token>\n": `token` is set
    kError,       // refuse: `error` says why (sent back as "ERR <error>")
  };
  State state = State::kIncomplete;
  std::string token;
  std::string error;
};

// Parses the bytes a client has sent so far on a new connection ("WCH1 <token>\n"; the
// token is 1..kMaxTokenLength ASCII letters and digits). Bytes after the first '\n' are
// ignored (a client sends nothing else before its descriptors come).
Handshake ParseHandshake(std::string_view received);

// The "ERR <message>\n" line sent before closing: exactly one line (newlines and other
// control characters in `message` become spaces) of at most kMaxErrorLine bytes.
inline constexpr size_t kMaxErrorLine = 4000;
std::string FormatErrorLine(std::string_view message);

// "EVENT <kind> <message>\n", sent on a lease's connection after its descriptors (the
// client reads it when it checks its lease): one line of at most kMaxHandshakeLine bytes,
// control characters in `message` made spaces. Kinds:
inline constexpr std::string_view kEventCorrupt = "corrupt";  // the memory changed after sealing
std::string FormatEventLine(std::string_view kind, std::string_view message);

}  // namespace weightcache::server
