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
// Bounds: request bodies over `max_body_bytes` are answered 413 without being read; a socket
// read or write that stalls for `request_timeout_ms` ends the connection; and every
// connection is shut down `connection_deadline_ms` after its TLS handshake began, whatever
// it is doing. Each connection holds one of `num_threads` workers while it lives: without the
// deadline, clients trickling a byte a second held every worker for as long as they liked
// and the API server's reviews waited past its timeout (issue 26: 23 s with 16 of them).
// With it, a slow client holds a worker at most the deadline, and a review waits at most
// about ceil(slow clients / num_threads) deadlines.
//
// Thread-safety: Start, the destructor and reloads() are for any one thread; handlers run on
// the library's worker threads. The server stops (joining every thread) in its destructor.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

struct ssl_st;

namespace httplib {
class SSLServer;
}

namespace weightcache::webhook {

struct ServerOptions {
  // IPv4:port to listen on; port 0 picks a free one (port() says which).
  std::string address = "0.0.0.0:8443";
  std::string cert_file;  // PEM: the serving certificate, then any intermediates
  std::string key_file;   // PEM: its private key
  absl::Duration reload_interval = absl::Seconds(5);
  uint64_t max_body_bytes = 4 << 20;  // an AdmissionReview of the largest Pod is ~3 MiB
  int request_timeout_ms = 10000;
  int connection_deadline_ms = 3000;
  int num_threads = 32;
};

struct KeyPair;  // parsed certificate chain and key (server.cc)

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

 private:
  explicit Server(ServerOptions options);
  void Watch();
  // Loads the pair when the files' identity changed since the last attempt.
  void MaybeReload();
  std::shared_ptr<const KeyPair> current() const;

  static int CertCallback(ssl_st* ssl, void* self);
  // SSL_CB_HANDSHAKE_START: the connection's deadline starts (ssl's SSL_CTX app data: this).
  static void InfoCallback(const ssl_st* ssl, int where, int ret);
  // Shuts down the connections past their deadline (reaper thread, every 100 ms).
  void Reap();

  struct Deadline {
    uint64_t inode = 0;  // the socket's: a closed number taken again has another
    std::chrono::steady_clock::time_point at;
  };

  const ServerOptions options_;
  std::unique_ptr<httplib::SSLServer> http_;
  std::thread listener_;
  absl::Notification listener_done_;
  int port_ = 0;
  std::string stamp_;  // identity of the files last attempted (watcher thread only)
  mutable absl::Mutex mu_;
  std::shared_ptr<const KeyPair> pair_ ABSL_GUARDED_BY(mu_);
  int reloads_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Notification stop_;
  std::thread watcher_;
  absl::Mutex deadlines_mu_;
  std::map<int, Deadline> deadlines_ ABSL_GUARDED_BY(deadlines_mu_);  // by socket descriptor
  uint64_t cut_ ABSL_GUARDED_BY(deadlines_mu_) = 0;
  std::thread reaper_;
};

}  // namespace weightcache::webhook
