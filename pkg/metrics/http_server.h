// The daemon's HTTP endpoint for Prometheus and Kubernetes probes, on civetweb:
//   GET /metrics  Prometheus text format (0.0.4) of every registered Collectable
//   GET /healthz  200 "ok" while the process serves HTTP at all (liveness)
//   GET /readyz   200 "ready" when the readiness check says so, else 503 with its reason
// Anything else is 404; methods other than GET and HEAD get 405.
//
// Thread-safety: every method may be called from any thread. Requests are served on
// civetweb's own threads; they call the Collectables' Collect() and the readiness check
// concurrently, so both must be thread-safe.
//
// Lifetimes: collectables are held as weak_ptr; one that has expired is skipped. The
// destructor stops the server and waits for requests in flight; after it returns nothing
// registered here is called again.
#pragma once

#include <sys/socket.h>

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

struct mg_connection;
struct mg_context;

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
  // Request-serving threads. Scrapes and probes are cheap; a few suffice.
  int num_threads = 4;
  // May be empty: then /readyz answers 503 "readiness check not set" until
  // SetReadinessCheck() is called.
  ReadinessCheck readiness;
};

class HttpServer {
 public:
  static constexpr const char* kDefaultAddress = "0.0.0.0:9464";

  // Binds and starts serving. Errors: InvalidArgument for an address that does not parse
  // (naming it); Unavailable when the bind fails (address in use, not local), with
  // civetweb's reason and the address.
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

 private:
  HttpServer(std::string address, ReadinessCheck readiness);
  static int HandleMetrics(mg_connection* conn, void* self);
  static int HandleHealthz(mg_connection* conn, void* self);
  static int HandleReadyz(mg_connection* conn, void* self);
  std::pair<bool, std::string> CheckReady() const ABSL_LOCKS_EXCLUDED(mu_);
  void WakeListener() const;

  const std::string address_;
  // Set once in Start, before the object is shared; read-only afterwards.
  int port_ = 0;
  sockaddr_storage wake_{};  // the listener as a client reaches it (0.0.0.0 -> 127.0.0.1)
  socklen_t wake_len_ = 0;
  mg_context* ctx_ = nullptr;  // owned; mg_stop in the destructor

  mutable absl::Mutex mu_;
  std::vector<std::weak_ptr<prometheus::Collectable>> collectables_ ABSL_GUARDED_BY(mu_);
  ReadinessCheck readiness_ ABSL_GUARDED_BY(mu_);
};

}  // namespace weightcache::metrics
