#include "pkg/util/bytes.h"

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

}  // namespace weightcache
