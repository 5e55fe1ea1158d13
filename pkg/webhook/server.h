// weightcache-webhook's HTTPS server: cpp-httplib with OpenSSL (Debian's civetweb cannot do TLS
// with OpenSSL 3: it dlopens libssl.so and asks for SSL_get_peer_certificate, a symbol
// OpenSSL 3 no longer exports, so mg_init_library(MG_FEATURES_SSL) fails), serving
//   POST /mutate   AdmissionReview v1 -> AdmissionReview response (mutate.h)
//   GET  /healthz  "ok"
// over TLS only (1.2 or later), with the certificate and key read from PEM files.
//
// Certificate reload: a watcher thread stats both files every `reload_interval` (following
// symlinks, so the kubelet's atomic swap of a mounted Secret's ..data link is seen as a new
// inode). When either changed, it loads the pair; a pair that fails to parse or whose key does
// not match the certificate is logged and the previous pair keeps being served (a Secret
// update in progress is retried on the next poll). The new pair serves every handshake from
// then on, through OpenSSL's certificate callback: the listening socket and the connections in
// flight are not touched.
//
// Connections (issue 47): one thread accepts, completes TLS handshakes, reads each request whole
// and sends each answer on non-blocking sockets; `num_threads` workers run complete requests
// only, from memory to memory (internal/front.h). Before, each connection held a worker from its
// accept, handshake included, and the listen backlog was httplib's 5: 128 slow clients that
// reconnected pushed a good review to 5.2-8.1 s, past the API server's 5 s timeout
// (failurePolicy Ignore: the pod was admitted unmutated). Then a head that announced a body it
// did not send (chunked, after Expect: 100-continue, or over 1 MiB) still went to a worker that
// waited for it: 4 addresses x 256 such heads pushed a good review to 2.4-3.8 s.
// Bounds: a listen backlog of `listen_backlog`; a handshake must finish within
// `handshake_timeout_ms` of the accept (an API server's takes milliseconds); a request must
// arrive whole within `connection_deadline_ms` of its first byte, and its answer must be taken
// within `request_timeout_ms`; an idle kept-alive connection is closed after 5 s; a body comes by
// Content-Length only, at most `max_body_bytes` (chunked: 411, Expect: 417, larger: 413, all
// answered at the head); `buffer_budget_bytes` of requests and answers in all; a whole request
// waits for a worker in its address's queue (served in turn with other addresses), at most
// `max_queued_per_source` of them and for at most `queue_deadline_ms` (then 503); at most
// `max_connections_per_source` connections from one IP address at once (one more is closed at
// accept) and `max_connections` in all (past it a newcomer takes the place of the connection
// longest in its handshake, else it is closed); the door is pkg/net's acceptor, as for every
// listener of the daemon, with EMFILE back-off.
//
// Thread-safety: Start, the destructor, reloads() and connection_stats() are for any one thread;
// handlers run on the front's worker threads. The server stops (joining every thread) in its
// destructor.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "pkg/webhook/connection_stats.h"
#include "pkg/webhook/mutate.h"

struct ssl_st;
struct ssl_ctx_st;

namespace weightcache::webhook {
namespace internal {
class Front;
}

struct ServerOptions {
  // IPv4:port to listen on; port 0 picks a free one (port() says which).
  std::string address = "0.0.0.0:8443";
  std::string cert_file;  // PEM: the serving certificate, then any intermediates
  std::string key_file;   // PEM: its private key
  absl::Duration reload_interval = absl::Seconds(5);
  uint64_t max_body_bytes = 4 << 20;  // an AdmissionReview of the largest Pod is ~3 MiB
  MutateOptions mutate;               // what an engine pod gets (the resource or a CSI volume)
  int request_timeout_ms = 10000;
  int connection_deadline_ms = 3000;
  int num_threads = 32;
  int listen_backlog = 1024;  // the kernel caps it at net.core.somaxconn (4096 since Linux 5.4)
  int handshake_timeout_ms = 1000;
  // The API server sends every review of its instance from one address, one connection per
  // review in flight (HTTP/1.1), and admits at most --max-mutating-requests-inflight (200 by
  // default) mutating requests at once: 256 lets one instance send a review for each of them
  // to a single replica, and still keeps one other address from holding more than a quarter of
  // max_connections.
  int max_connections_per_source = 256;
  int max_connections = 1024;
  // Bytes of requests (read, waiting or being served) and answers (not yet sent) held at once;
  // past it the connection with the largest request being read is answered 503. At least
  // max_body_bytes + 64 KiB.
  uint64_t buffer_budget_bytes = 64 << 20;
  // Whole requests from one IP address waiting for a worker: one more is answered 503. With 32
  // workers, 160 reviews from one API server instance in flight at once are served.
  int max_queued_per_source = 128;
  // A whole request that waited this long for a worker is answered 503 (the API server gives up
  // at its timeoutSeconds, 5 s in the chart, and applies failurePolicy).
  int queue_deadline_ms = 2000;
};

struct KeyPair;  // parsed certificate chain and key (server.cc)
class Router;    // httplib's routing and HTTP parsing, run on a stream (server.cc)

class Server {
 public:
  // Loads the certificate pair (an error names the file and OpenSSL's reason), listens and
  // starts the watcher.
  static absl::StatusOr<std::unique_ptr<Server>> Start(ServerOptions options);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  int port() const { return port_; }
  // How many times a changed pair was loaded and is being served.
  int reloads() const;
  ConnectionStats connection_stats() const;

 private:
  explicit Server(ServerOptions options);
  void Watch();
  // Loads the pair when the files' identity changed since the last attempt.
  void MaybeReload();
  std::shared_ptr<const KeyPair> current() const;

  static int CertCallback(ssl_st* ssl, void* self);

  const ServerOptions options_;
  int port_ = 0;
  std::string stamp_;  // identity of the files last attempted (watcher thread only)
  mutable absl::Mutex mu_;
  std::shared_ptr<const KeyPair> pair_ ABSL_GUARDED_BY(mu_);
  int reloads_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Notification stop_;
  std::thread watcher_;
  std::unique_ptr<ssl_ctx_st, void (*)(ssl_ctx_st*)> ctx_{nullptr, nullptr};
  std::unique_ptr<Router> router_;
  std::unique_ptr<internal::Front> front_;  // destroyed first: its workers use router_, ctx_
};

}  // namespace weightcache::webhook
