// The daemon's HTTP endpoint for Prometheus and Kubernetes probes, a small HTTP/1.1 server:
//   GET /metrics  Prometheus text format (0.0.4) of every registered Collectable
//   GET /healthz  200 "ok" while the process serves HTTP at all (liveness)
//   GET /readyz   200 "ready" when the readiness check says so, else 503 with its reason
// Anything else is 404; methods other than GET and HEAD get 405. Requests carry no body; every
// answer closes its connection.
//
// The port is open to whoever reaches the node (scrapers, the kubelet, any pod), so it is
// served the way every listener is (pkg/net/acceptor.h): caps per source address and in all,
// a first-byte deadline and EMFILE back-off; then the whole request head must arrive within
// `head_timeout` of the connect (a client that trickles a header line at a time is closed
// there, counted "head_deadline"). One event loop reads every head without blocking and answers
// /healthz and /readyz itself; /metrics is rendered on `num_threads` workers. So slow or
// silent clients cost a descriptor each, within their source's cap, never the liveness answer.
//
// Thread-safety: every method may be called from any thread. The readiness check runs on the
// loop thread and must be quick; the Collectables' Collect() runs on the render workers,
// concurrently with each other and with the check, so both must be thread-safe.
//
// Lifetimes: collectables are held as weak_ptr; one that has expired is skipped. The
// destructor stops the server, waits for renders in flight and closes every connection; after
// it returns nothing registered here is called again.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "pkg/metrics/metrics.h"

namespace prometheus {
class Collectable;
}  // namespace prometheus

namespace weightcache::metrics {

// Says whether the daemon is ready to serve and, if not, why (e.g. "loading llama-70b").
using ReadinessCheck = std::function<std::pair<bool, std::string>()>;

struct HttpServerOptions {
  // "IPv4:port" or "[IPv6]:port"; the host must be a numeric address. Port 0 binds an
  // ephemeral port (read it back with HttpServer::port()).
  std::string address = "0.0.0.0:9464";
  // Threads rendering /metrics (rendering may take time; probes never wait for it).
  int num_threads = 1;
  // May be empty: then /readyz answers 503 "readiness check not set" until
  // SetReadinessCheck() is called.
  ReadinessCheck readiness;
  // Connections open at once, in all and per source address (the kubelet probes from the
  // node's address, a scraper from its pod's: neither shares a cap with a hostile pod).
  uint64_t max_connections = 256;
  uint64_t max_connections_per_source = 16;
  // The first byte and the whole request head must arrive within this of the connect.
  std::chrono::milliseconds head_timeout{2000};
  // A head larger than this is answered 431 and closed.
  size_t max_head_bytes = 8192;
  // The answer must be taken by the client within this of its request (a /metrics render
  // included); else the connection is closed.
  std::chrono::milliseconds response_timeout{10000};
};

class HttpServer {
 public:
  static constexpr const char* kDefaultAddress = "0.0.0.0:9464";

  // Binds and starts serving. Errors: InvalidArgument for an address that does not parse
  // (naming it) or options out of range; Unavailable when the bind fails (address in use,
  // not local), with the reason and the address.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(HttpServerOptions options);
  // Start() with `address` and the other options at their defaults.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(const std::string& address);

  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // The bound TCP port (the ephemeral one when the address asked for port 0).
  int port() const { return port_; }
  const std::string& address() const { return address_; }

  // Adds a source for /metrics (a prometheus::Registry, Metrics::collectable()).
  void RegisterCollectable(std::weak_ptr<prometheus::Collectable> collectable)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Replaces the readiness check used by /readyz.
  void SetReadinessCheck(ReadinessCheck check) ABSL_LOCKS_EXCLUDED(mu_);

  // The body that /metrics serves now.
  std::string RenderMetrics() const ABSL_LOCKS_EXCLUDED(mu_);

  // The door's counters as the listener "metrics": the acceptor's reasons and this server's
  // own ("head_deadline": the head did not arrive in time; "bad_request": too large or not
  // HTTP).
  ListenerSnapshot listener() const;

 private:
  class Loop;
  HttpServer(std::string address, ReadinessCheck readiness);
  std::pair<bool, std::string> CheckReady() const ABSL_LOCKS_EXCLUDED(mu_);

  const std::string address_;
  // Set once in Start, before the object is shared; read-only afterwards.
  int port_ = 0;
  std::unique_ptr<Loop> loop_;

  mutable absl::Mutex mu_;
  std::vector<std::weak_ptr<prometheus::Collectable>> collectables_ ABSL_GUARDED_BY(mu_);
  ReadinessCheck readiness_ ABSL_GUARDED_BY(mu_);
};

}  // namespace weightcache::metrics
