// The webhook's connection front (issue 47): one thread accepts connections, completes their TLS
// handshakes and reads each request whole, all on non-blocking sockets under epoll; a pool of
// workers runs only complete requests. A slow client (one that trickles its ClientHello, stalls
// mid-handshake or trickles its request) therefore costs a file descriptor and a TLS session
// until its deadline, never a worker: the API server's reviews are not queued behind it.
//
// Bounds, each cut counted in ConnectionStats:
//   - the listening socket's backlog is `listen_backlog` (the kernel caps it at somaxconn);
//   - a TLS handshake must finish within `handshake_timeout_ms` of the accept;
//   - a request must arrive whole within `request_deadline_ms` of its first byte, and a worker's
//     read or write of it stalls at most `io_timeout_ms`;
//   - a kept-alive connection with no request waits `idle_timeout_ms`;
//   - at most `max_connections_per_source` connections from one IP address at once: one more is
//     closed as soon as it is accepted;
//   - at most `max_connections` in all: past it, new connections wait in the backlog until one
//     closes (at most the handshake timeout for a slow client).
// Bodies up to `prefetch_body_bytes` are read in the loop; a larger one, or one that is chunked or
// expects 100-continue, is read by its worker under the request deadline; bytes buffered in the
// loop over all connections stay below `prefetch_budget_bytes` (past it, requests go to workers
// as they are).
//
// Thread-safety: Start and the destructor from one thread; stats() from any. `serve` runs on the
// worker threads, concurrently, and must outlive the Front; so must `ctx`.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "pkg/webhook/connection_stats.h"

struct ssl_ctx_st;

namespace httplib {
class Stream;
}

namespace weightcache::webhook::internal {

struct FrontOptions {
  int listen_backlog = 1024;
  int handshake_timeout_ms = 1000;
  int request_deadline_ms = 3000;
  int io_timeout_ms = 10000;
  int idle_timeout_ms = 5000;
  int max_connections = 1024;
  int max_connections_per_source = 256;
  int num_threads = 8;
  uint64_t prefetch_body_bytes = 1 << 20;
  uint64_t prefetch_budget_bytes = 64 << 20;
};

// Reads one request from the stream and writes its answer; returns false when the connection
// must close (as does setting `closed`). `close` asks for "Connection: close".
using ServeFn = std::function<bool(httplib::Stream& stream, bool close, bool& closed)>;

class Front {
 public:
  // Listens on IPv4 `host`:`port` (0: any free port) and starts the loop and the workers.
  static absl::StatusOr<std::unique_ptr<Front>> Start(const std::string& host, int port,
                                                      ssl_ctx_st* ctx, FrontOptions options,
                                                      ServeFn serve);
  // Stops accepting, lets each worker finish its request, and closes every connection.
  ~Front();
  Front(const Front&) = delete;
  Front& operator=(const Front&) = delete;

  int port() const;
  ConnectionStats stats() const;

  class Impl;

 private:
  explicit Front(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace weightcache::webhook::internal
