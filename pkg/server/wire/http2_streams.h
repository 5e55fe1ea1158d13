// Counts what a client costs gRPC on one control connection by reading frame headers only
// (RFC 9113 section 4.1: 24-bit length, type, flags, stream id), never header blocks or data:
// - the streams open: gRPC 1.51 enforces SETTINGS_MAX_CONCURRENT_STREAMS only once the peer
//   acknowledged its SETTINGS, so a peer that never does can open any number of idle streams,
//   each holding a server call;
// - the header block being received: HEADERS without END_HEADERS and the CONTINUATION frames
//   after it are buffered by gRPC until the block ends (a CONTINUATION flood grows it without
//   bound); counted as payload plus 9 bytes per frame, so empty frames count too;
// - the streams the client reset (RST_STREAM): each reset stream's call is set up and torn
//   down again, so a peer that opens and resets in a loop ("rapid reset", CVE-2023-44487)
//   costs CPU and memory without ever holding a stream open.
// The relay in front of gRPC (connection_relay.h) closes a connection past its limits.
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
  // Bytes (payload + frame headers) of the client's header block not yet ended; 0 between
  // blocks.
  uint64_t header_block_bytes() const { return header_block_; }
  // RST_STREAM frames the client sent, all told.
  uint64_t client_resets() const { return client_resets_; }

 private:
  // One direction's frame header reader: calls `on_frame(type, flags, stream)` per frame.
  struct Reader {
    size_t skip = 0;  // preface or payload bytes still to pass over
    uint8_t header[9] = {};
    size_t have = 0;
    template <typename F>
    void Feed(const char* data, size_t n, F&& on_frame);
  };
  void OnClientFrame(uint8_t type, uint8_t flags, uint32_t stream, size_t length);
  void OnServerFrame(uint8_t type, uint8_t flags, uint32_t stream);

  Reader client_{24};  // the client preface "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
  Reader server_{0};
  uint32_t last_opened_ = 0;
  absl::flat_hash_set<uint32_t> open_;
  bool in_block_ = false;  // a HEADERS or PUSH_PROMISE without END_HEADERS was the last
  uint64_t header_block_ = 0;
  uint64_t client_resets_ = 0;
};

}  // namespace weightcache::server
