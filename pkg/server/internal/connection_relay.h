// Relays each control connection between its client and gRPC through a socket pair, reading
// the HTTP/2 frame headers that pass (http2_streams.h) and closing a connection whose client
// holds more streams open than `max_streams` (gRPC 1.51 bounds neither their number, for a
// peer that never acknowledges SETTINGS, nor the memory each one holds). Each direction is
// buffered up to 64 KiB; a full buffer stops reading its source (back-pressure), so a
// connection costs at most 128 KiB here. Not a public header.
//
// Thread-safety: Add and counters from any thread; one thread of its own moves the bytes.
// Lifetimes: the destructor closes every relayed connection (gRPC then sees its end close).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "pkg/util/mutex.h"
#include "pkg/util/scoped_fd.h"

namespace weightcache::server {

class ConnectionRelay {
 public:
  struct Options {
    size_t max_streams = 64;  // a gRPC client keeps within the server's 16 (SETTINGS)
  };
  static absl::StatusOr<std::unique_ptr<ConnectionRelay>> Start(Options options);
  ~ConnectionRelay();
  ConnectionRelay(const ConnectionRelay&) = delete;
  ConnectionRelay& operator=(const ConnectionRelay&) = delete;

  // Relays `client` (`label` names it in logs) and returns the other end for gRPC, which owns
  // it from then on. Errors (out of descriptors) leave `client` closed.
  absl::StatusOr<int> Add(ScopedFd client, std::string label);

  struct Counters {
    uint64_t relayed = 0;
    uint64_t closed_over_streams = 0;  // closed for holding more than max_streams
  };
  Counters counters() const;

 private:
  struct Conn;
  explicit ConnectionRelay(Options options, ScopedFd epoll, ScopedFd wake);
  void Loop();
  void Register(std::unique_ptr<Conn> c);
  // Moves what can move without blocking; false when the connection is over.
  bool Pump(Conn& c);
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
