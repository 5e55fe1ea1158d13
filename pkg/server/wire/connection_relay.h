// Relays each control connection between its client and gRPC through a socket pair, reading
// the HTTP/2 frame headers that pass (http2_streams.h) and closing a connection whose client
// holds more streams open than `max_streams` (gRPC 1.51 bounds neither their number, for a
// peer that never acknowledges SETTINGS, nor the memory each one holds), sends a header block
// longer than `max_header_block` (a CONTINUATION flood, which gRPC buffers whole), or resets
// streams faster than its reset budget allows (rapid reset). The bytes that broke a limit
// are never passed on. Each direction is
// buffered up to 64 KiB; a full buffer stops reading its source (back-pressure), so a
// connection costs at most 128 KiB here. Not a public header.
//
// Thread-safety: Add and counters from any thread; one thread of its own moves the bytes.
// Lifetimes: the destructor closes every relayed connection (gRPC then sees its end close).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "pkg/net/activity.h"
#include "pkg/net/keyed_limiter.h"
#include "pkg/util/mutex.h"
#include "pkg/util/scoped_fd.h"

namespace weightcache::server {

class ConnectionRelay {
 public:
  struct Options {
    size_t max_streams = 64;  // a gRPC client keeps within the server's 16 (SETTINGS)
    // gRPC's own metadata limit is 8 KiB (GRPC_ARG_MAX_METADATA_SIZE): a block 8 times that
    // is no request it would serve.
    uint64_t max_header_block = 64 << 10;
    // Streams a client may reset (a cancelled call, an expired deadline): `reset_burst` at
    // once, then `resets_per_second` on average. A gRPC client resets one stream per
    // cancelled call; an attacker resets thousands per second.
    double reset_burst = 256;
    double resets_per_second = 32;
    // Called on the relay's thread for each connection closed for a limit ("streams",
    // "header_block", "resets"); must not block. Optional.
    std::function<void(const std::string& limit)> on_closed;
  };
  static absl::StatusOr<std::unique_ptr<ConnectionRelay>> Start(Options options);
  ~ConnectionRelay();
  ConnectionRelay(const ConnectionRelay&) = delete;
  ConnectionRelay& operator=(const ConnectionRelay&) = delete;

  // Relays `client` (`label` names it in logs) and returns the other end for gRPC, which owns
  // it from then on. `slot` (its place in the listener's caps) is held until the connection
  // ends; `activity` (the acceptor's idle clock) is touched as bytes pass and is busy while
  // the client holds a stream open (a call in flight, a watch), so only a connection with no
  // call and no byte for the idle time is ended. Errors (out of descriptors) leave `client`
  // closed and `slot` given back.
  absl::StatusOr<int> Add(ScopedFd client, net::KeyedLimiter::Slot slot, std::string label,
                          net::ActivityHandle activity = {});

  struct Counters {
    uint64_t relayed = 0;
    uint64_t closed_over_streams = 0;       // closed for holding more than max_streams
    uint64_t closed_over_header_block = 0;  // for a header block past max_header_block
    uint64_t closed_over_resets = 0;        // for resetting past the reset budget
  };
  Counters counters() const;

 private:
  struct Conn;
  explicit ConnectionRelay(Options options, ScopedFd epoll, ScopedFd wake);
  void Loop();
  void Register(std::unique_ptr<Conn> c);
  // Moves what can move without blocking; false when the connection is over.
  bool Pump(Conn& c);
  // Why the client's bytes so far break a limit; nullptr while they do not.
  const char* OverLimit(Conn& c) const;
  void Watch(Conn& c, bool add);

  const Options options_;
  ScopedFd epoll_;
  ScopedFd wake_;
  std::atomic<bool> stop_{false};
  mutable Mutex mu_;
  std::vector<std::unique_ptr<Conn>> incoming_ ABSL_GUARDED_BY(mu_);
  Counters counters_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace weightcache::server
