// The webhook's connection front (issue 47): one thread, the loop, accepts connections, completes
// their TLS handshakes, reads each request whole and writes each answer, all on non-blocking
// sockets under epoll; a pool of workers runs complete requests only, from memory to memory
// (a worker reads the bytes the loop buffered and writes into a buffer the loop sends). A slow
// client (one that trickles its ClientHello, stalls mid-handshake, trickles or stalls its
// request, or does not read its answer) therefore costs a file descriptor, a TLS session and its
// buffered bytes until its deadline, never a worker: the API server's reviews are not queued
// behind it.
//
// What the loop reads (an AdmissionReview always carries Content-Length; internal/http_head.h),
// answered by the loop and closed, never handed to a worker:
//   - a head with Transfer-Encoding (chunked): 411; a request other than GET or HEAD without
//     Content-Length: 411; a head with Expect (100-continue): 417;
//   - a Content-Length past `max_body_bytes`: 413, before any of the body is read;
//   - a head past 64 KiB: 431; a malformed head (a header line without a name and colon, a
//     folded line, a bare CR or LF, a Content-Length that is not one decimal number): 400.
// A body is read in the loop up to its Content-Length; the request goes to a worker only when
// its head and whole body are buffered.
//
// Bounds, each cut counted in ConnectionStats:
//   - the listening socket's backlog is `listen_backlog` (the kernel caps it at somaxconn);
//   - a TLS handshake must finish within `handshake_timeout_ms` of the accept;
//   - a request must arrive whole within `request_deadline_ms` of its first byte;
//   - a kept-alive connection with no request waits `idle_timeout_ms` (the acceptor's idle
//     timeout: it is busy from its accept until it waits for a request);
//   - an answer must be taken by the client within `io_timeout_ms`;
//   - bytes buffered over all connections (requests read, waiting or being served, and answers
//     not yet sent) stay below `buffer_budget_bytes` (plus one 16 KiB read): past it the
//     connection with the largest request still being read is answered 503 and closed;
//   - complete requests wait for a worker in one queue per source address, served in turn
//     (one request of each address with requests waiting, then the next round): at most
//     `max_queued_per_source` from one address (one more is answered 503 and closed), each for
//     at most `queue_deadline_ms` (past it answered 503 and closed by the loop);
//   - connections are accepted through pkg/net's acceptor, run by the loop (own_thread false):
//     the first byte of the handshake within `handshake_timeout_ms` of the accept (until then a
//     connection costs its descriptor and its place in the caps only), EMFILE back-off;
//   - at most `max_connections_per_source` connections from one IP address at once: one more is
//     closed as soon as it is accepted;
//   - at most `max_connections` in all: past it, a newcomer takes the place of the connection
//     longest in its handshake (closed), else it is closed.
// A connection that gets an error answer (4xx or 503) is closed after it: close_notify, then
// what the client still sends is read and dropped for up to 1 s (or 1 MiB) so that the answer is
// not lost to a reset.
//
// Start sets SIGPIPE to be ignored when it still has its default action (the loop writes to
// clients that may have gone).
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
  uint64_t max_body_bytes = 4 << 20;
  uint64_t buffer_budget_bytes = 64 << 20;
  int max_queued_per_source = 128;
  int queue_deadline_ms = 2000;
};

// Reads one request from the stream and writes its answer; returns false when the connection
// must close (as does setting `closed`). `close` asks for "Connection: close". The stream holds
// the whole request (reading past it gives end of stream) and takes the answer into a buffer.
using ServeFn = std::function<bool(httplib::Stream& stream, bool close, bool& closed)>;

class Front {
 public:
  // Listens on IPv4 `host`:`port` (0: any free port) and starts the loop and the workers.
  static absl::StatusOr<std::unique_ptr<Front>> Start(const std::string& host, int port,
                                                      ssl_ctx_st* ctx, FrontOptions options,
                                                      ServeFn serve);
  // Lets each worker finish its request (its answer is sent if the client's socket takes it at
  // once), then stops accepting and closes every connection.
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
