// Counts the HTTP/2 streams open on one control connection by reading frame headers only
// (RFC 9113 section 4.1: 24-bit length, type, flags, stream id), never header blocks or data.
// gRPC 1.51 enforces SETTINGS_MAX_CONCURRENT_STREAMS only once the peer acknowledged its
// SETTINGS, so a peer that never does can open any number of idle streams, each holding a
// server call; the relay in front of gRPC (connection_relay.h) closes such a connection.
// Not a public header.
//
// Thread-safety: none (one per connection, used by the relay thread).
#pragma once

#include <cstddef>
#include <cstdint>

#include "absl/container/flat_hash_set.h"

namespace weightcache::server {

class Http2StreamTracker {
 public:
  // Bytes the client sent (beginning with the connection preface) and bytes the server sent.
  void FromClient(const char* data, size_t n);
  void FromServer(const char* data, size_t n);
  // Streams the client opened that the server has not ended yet.
  size_t open() const { return open_.size(); }

 private:
  // One direction's frame header reader: calls `on_frame(type, flags, stream)` per frame.
  struct Reader {
    size_t skip = 0;  // preface or payload bytes still to pass over
    uint8_t header[9] = {};
    size_t have = 0;
    template <typename F>
    void Feed(const char* data, size_t n, F&& on_frame);
  };
  void OnClientFrame(uint8_t type, uint8_t flags, uint32_t stream);
  void OnServerFrame(uint8_t type, uint8_t flags, uint32_t stream);

  Reader client_{24};  // the client preface "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
  Reader server_{0};
  uint32_t last_opened_ = 0;
  absl::flat_hash_set<uint32_t> open_;
};

}  // namespace weightcache::server
