// Reads TLS record headers in one direction of a connection without decrypting anything
// (RFC 8446 5.1, RFC 5246 6.2): type, legacy version, length, then the body skipped. What the
// peer port (peer_port.h) sees of a handshake. Pure bookkeeping, unit-tested on its own.
// Not a public header. Thread-safety: none (one connection's reader).
#pragma once

#include <cstddef>
#include <cstdint>

namespace weightcache::server {

class TlsRecordScanner {
 public:
  enum Type : uint8_t {
    kChangeCipherSpec = 20,
    kAlert = 21,
    kHandshake = 22,
    kApplicationData = 23,
  };
  // `first_must_be_handshake`: the client's side (its first record is a ClientHello).
  explicit TlsRecordScanner(bool first_must_be_handshake)
      : first_must_be_handshake_(first_must_be_handshake) {}
  // Feeds the next bytes; false once they cannot be TLS records (an unknown type, a version
  // that is not 3.x, a length past 2^14 + 2048, a client's first record that is no handshake),
  // and for ever after.
  bool Feed(const char* p, size_t n);
  // Application-data records whose header was read, and whose body was read whole.
  uint64_t application_data_started() const { return app_started_; }
  uint64_t application_data_completed() const { return app_completed_; }
  uint64_t records() const { return records_; }
  bool broken() const { return broken_; }

 private:
  void EndRecord();

  const bool first_must_be_handshake_;
  uint8_t header_[5] = {};
  size_t header_len_ = 0;
  size_t body_left_ = 0;
  bool in_body_ = false;
  uint8_t type_ = 0;
  uint64_t records_ = 0;
  uint64_t app_started_ = 0;
  uint64_t app_completed_ = 0;
  bool broken_ = false;
};

}  // namespace weightcache::server
