#include "pkg/server/wire/http2_streams.h"

#include <algorithm>

namespace weightcache::server {
namespace {

constexpr uint8_t kData = 0x0;
constexpr uint8_t kHeaders = 0x1;
constexpr uint8_t kRstStream = 0x3;
constexpr uint8_t kPushPromise = 0x5;
constexpr uint8_t kContinuation = 0x9;
constexpr uint8_t kEndStream = 0x1;
constexpr uint8_t kEndHeaders = 0x4;
constexpr uint64_t kFrameHeaderBytes = 9;

}  // namespace

template <typename F>
void Http2StreamTracker::Reader::Feed(const char* data, size_t n, F&& on_frame) {
  while (n > 0) {
    if (skip > 0) {
      const size_t k = std::min(skip, n);
      skip -= k;
      data += k;
      n -= k;
      continue;
    }
    const size_t k = std::min(sizeof header - have, n);
    std::copy_n(data, k, header + have);
    have += k;
    data += k;
    n -= k;
    if (have < sizeof header) return;
    have = 0;
    skip = (size_t{header[0]} << 16) | (size_t{header[1]} << 8) | header[2];
    const uint32_t stream = ((uint32_t{header[5]} & 0x7f) << 24) | (uint32_t{header[6]} << 16) |
                            (uint32_t{header[7]} << 8) | header[8];
    on_frame(header[3], header[4], stream, skip);
  }
}

void Http2StreamTracker::FromClient(const char* data, size_t n) {
  client_.Feed(data, n, [this](uint8_t t, uint8_t f, uint32_t s, size_t len) {
    OnClientFrame(t, f, s, len);
  });
}

void Http2StreamTracker::FromServer(const char* data, size_t n) {
  server_.Feed(data, n, [this](uint8_t t, uint8_t f, uint32_t s, size_t /*len*/) {
    OnServerFrame(t, f, s);
  });
}

void Http2StreamTracker::OnClientFrame(uint8_t type, uint8_t flags, uint32_t stream,
                                       size_t length) {
  // A header block: HEADERS or PUSH_PROMISE, then CONTINUATION frames up to END_HEADERS.
  if (type == kHeaders || type == kPushPromise || (type == kContinuation && in_block_)) {
    if (type != kContinuation) header_block_ = 0;
    header_block_ += length + kFrameHeaderBytes;
    in_block_ = (flags & kEndHeaders) == 0;
    if (!in_block_) header_block_ = 0;
  }
  if (type == kRstStream) ++client_resets_;
  if (stream == 0) return;
  if (type == kHeaders && stream > last_opened_) {
    // A new stream (client ids only grow; a lower one is trailers or a protocol error that
    // gRPC itself answers by closing the connection).
    last_opened_ = stream;
    open_.insert(stream);
  } else if (type == kRstStream) {
    open_.erase(stream);
  }
}

void Http2StreamTracker::OnServerFrame(uint8_t type, uint8_t flags, uint32_t stream) {
  if (stream == 0) return;
  // The server is done with a stream once it ended its side (gRPC: trailers) or reset it.
  if (type == kRstStream || ((type == kHeaders || type == kData) && (flags & kEndStream))) {
    open_.erase(stream);
  }
}

}  // namespace weightcache::server
