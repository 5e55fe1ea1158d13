// libFuzzer target: the handle channel's handshake parsing and error lines
// (pkg/server/wire/handle_message.h). The input is also fed in pieces, as reads deliver it: the
// verdict on a prefix that is already decided never changes as more bytes arrive.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "pkg/server/wire/handle_message.h"
#include "tests/fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using weightcache::server::Handshake;
  namespace server = weightcache::server;
  const std::string_view input(reinterpret_cast<const char*>(data), size);

  const Handshake whole = server::ParseHandshake(input);
  switch (whole.state) {
    case Handshake::State::kIncomplete:
      FUZZ_CHECK(input.find('\n') == std::string_view::npos);
      FUZZ_CHECK(input.size() < server::kMaxHandshakeLine);
      break;
    case Handshake::State::kToken:
      FUZZ_CHECK(!whole.token.empty() && whole.token.size() <= server::kMaxTokenLength);
      FUZZ_CHECK(input.substr(0, 5 + whole.token.size() + 1) == "WCH1 " + whole.token + "\n");
      break;
    case Handshake::State::kError:
      FUZZ_CHECK(!whole.error.empty());
      break;
  }
  // Byte by byte: the first decided prefix decides the same way as the whole input.
  for (size_t n = 0; n <= size; ++n) {
    const Handshake part = server::ParseHandshake(input.substr(0, n));
    if (part.state == Handshake::State::kIncomplete) continue;
    FUZZ_CHECK(part.state == whole.state && part.token == whole.token && part.error == whole.error);
    break;
  }

  const std::string line = server::FormatErrorLine(input);
  FUZZ_CHECK(line.size() <= server::kMaxErrorLine);
  FUZZ_CHECK(line.rfind("ERR ", 0) == 0);
  FUZZ_CHECK(line.find('\n') == line.size() - 1);
  return 0;
}
