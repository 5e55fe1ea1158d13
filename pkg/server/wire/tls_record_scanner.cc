#include "pkg/server/wire/tls_record_scanner.h"

#include <algorithm>

namespace weightcache::server {
namespace {
// TLSCiphertext.length may not exceed 2^14 + 2048 (RFC 5246 6.2.3; RFC 8446 allows less).
constexpr size_t kMaxRecordBody = (1 << 14) + 2048;
}  // namespace

void TlsRecordScanner::EndRecord() {
  in_body_ = false;
  if (type_ == kApplicationData) ++app_completed_;
}

bool TlsRecordScanner::Feed(const char* p, size_t n) {
  while (n > 0 && !broken_) {
    if (in_body_) {
      const size_t take = std::min(n, body_left_);
      body_left_ -= take;
      p += take;
      n -= take;
      if (body_left_ == 0) EndRecord();
      continue;
    }
    header_[header_len_++] = static_cast<uint8_t>(*p++);
    --n;
    if (header_len_ < sizeof header_) continue;
    header_len_ = 0;
    type_ = header_[0];
    const size_t length = (static_cast<size_t>(header_[3]) << 8) | header_[4];
    const bool known = type_ >= kChangeCipherSpec && type_ <= kApplicationData;
    // The legacy version is 3.x in every TLS record (3.1 in a first ClientHello).
    if (!known || header_[1] != 3 || length > kMaxRecordBody ||
        (records_ == 0 && first_must_be_handshake_ && type_ != kHandshake)) {
      broken_ = true;
      break;
    }
    ++records_;
    if (type_ == kApplicationData) ++app_started_;
    body_left_ = length;
    in_body_ = true;
    if (length == 0) EndRecord();
  }
  return !broken_;
}

}  // namespace weightcache::server
