#include "pkg/util/bytes.h"

#include <sys/random.h>

#include <cerrno>

#include "pkg/util/log.h"

namespace weightcache {

std::string HexEncode(const void* data, size_t n) {
  static constexpr char kDigits[] = "0123456789abcdef";
  const auto* b = static_cast<const unsigned char*>(data);
  std::string out(2 * n, '0');
  for (size_t i = 0; i < n; ++i) {
    out[2 * i] = kDigits[b[i] >> 4];
    out[2 * i + 1] = kDigits[b[i] & 0xf];
  }
  return out;
}

std::string RandomHex(size_t bytes) {
  std::string raw(bytes, '\0');
  // getrandom(2), not /dev/urandom: opening a file fails with EMFILE when the daemon's
  // descriptors run out (a connection flood), and that aborted the daemon (issue 26).
  // Reads of up to 256 bytes from the initialized pool are never short nor interrupted.
  WC_CHECK(bytes <= 256);
  ssize_t n;
  do {
    n = ::getrandom(raw.data(), bytes, 0);
  } while (n < 0 && errno == EINTR);
  WC_CHECK(n == static_cast<ssize_t>(bytes));
  return HexEncode(raw.data(), raw.size());
}

}  // namespace weightcache
