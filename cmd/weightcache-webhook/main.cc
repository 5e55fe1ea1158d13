// weightcache-webhook: the mutating admission webhook that lets the pod annotation
// weightcache.io/model alone select a model (pkg/webhook/mutate.h). Parses flags, serves HTTPS
// until SIGINT/SIGTERM, reloading its certificate when the files change.
#include <signal.h>

#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/time/time.h"
#include "pkg/util/flags_help.h"
#include "pkg/util/log.h"
#include "pkg/webhook/server.h"

ABSL_FLAG(std::string, address, "0.0.0.0:8443", "IPv4:port to serve HTTPS on");
ABSL_FLAG(std::string, tls_cert_file, "/etc/weightcache-webhook/tls/tls.crt",
          "PEM serving certificate (then intermediates); reloaded when it changes");
ABSL_FLAG(std::string, tls_key_file, "/etc/weightcache-webhook/tls/tls.key",
          "PEM private key of --tls_cert_file; reloaded with it");
ABSL_FLAG(absl::Duration, reload_interval, absl::Seconds(5),
          "How often the certificate files are checked for a change");
ABSL_FLAG(uint64_t, max_body_bytes, 4 << 20, "Largest request body accepted (413 past it)");
ABSL_FLAG(int, request_timeout_ms, 10000,
          "An answer the client does not take within this ends the connection");
ABSL_FLAG(int, connection_deadline_ms, 3000,
          "A request must arrive whole within this of its first byte, or its connection is "
          "closed");
ABSL_FLAG(int, handshake_timeout_ms, 1000,
          "A TLS handshake must finish within this of the accept (an API server's takes "
          "milliseconds), or its connection is closed");
ABSL_FLAG(int, listen_backlog, 1024, "Connections the kernel queues before they are accepted");
ABSL_FLAG(int, max_connections_per_source, 256,
          "Connections open at once from one IP address; one more is closed at accept (the API "
          "server sends one connection per review in flight, at most its "
          "--max-mutating-requests-inflight, 200 by default)");
ABSL_FLAG(int, max_connections, 1024,
          "Connections open at once in all; more wait in the listen backlog");
ABSL_FLAG(int, threads, 32,
          "Request threads: they run complete requests only (one thread accepts connections, "
          "does their TLS handshakes, reads their requests and sends the answers)");
ABSL_FLAG(uint64_t, buffer_budget_bytes, 64 << 20,
          "Bytes of requests and answers held at once; past it the largest request being read "
          "is answered 503 (at least --max_body_bytes + 64 KiB)");
ABSL_FLAG(int, max_queued_per_source, 128,
          "Whole requests from one IP address waiting for a request thread; one more is "
          "answered 503");
ABSL_FLAG(int, queue_deadline_ms, 2000,
          "A whole request that waited this long for a request thread is answered 503");
ABSL_FLAG(std::string, inject, "device-plugin",
          "What an engine pod gets to reach the daemon: device-plugin (the extended resource "
          "weightcache.io/client, whose Allocate mounts the socket directory) or csi (an inline "
          "volume of the daemon's CSI driver: the pod's own sockets, so the daemon knows the pod "
          "without hostPID)");
ABSL_FLAG(std::string, socket_mount_path, "/run/weightcache",
          "With --inject=csi: where the volume is mounted in each engine container");
ABSL_FLAG(bool, verbose, false, "Debug logging");

namespace weightcache {
namespace {

int Run() {
  if (absl::GetFlag(FLAGS_verbose)) SetLogLevel(LogLevel::kDebug);
  webhook::ServerOptions o;
  o.address = absl::GetFlag(FLAGS_address);
  o.cert_file = absl::GetFlag(FLAGS_tls_cert_file);
  o.key_file = absl::GetFlag(FLAGS_tls_key_file);
  o.reload_interval = absl::GetFlag(FLAGS_reload_interval);
  o.max_body_bytes = absl::GetFlag(FLAGS_max_body_bytes);
  o.request_timeout_ms = absl::GetFlag(FLAGS_request_timeout_ms);
  o.num_threads = absl::GetFlag(FLAGS_threads);
  o.connection_deadline_ms = absl::GetFlag(FLAGS_connection_deadline_ms);
  o.handshake_timeout_ms = absl::GetFlag(FLAGS_handshake_timeout_ms);
  o.listen_backlog = absl::GetFlag(FLAGS_listen_backlog);
  o.max_connections_per_source = absl::GetFlag(FLAGS_max_connections_per_source);
  o.max_connections = absl::GetFlag(FLAGS_max_connections);
  o.buffer_budget_bytes = absl::GetFlag(FLAGS_buffer_budget_bytes);
  o.max_queued_per_source = absl::GetFlag(FLAGS_max_queued_per_source);
  o.queue_deadline_ms = absl::GetFlag(FLAGS_queue_deadline_ms);
  const std::string inject = absl::GetFlag(FLAGS_inject);
  if (inject != "device-plugin" && inject != "csi") {
    std::fprintf(stderr, "weightcache-webhook: --inject: '%s' is neither device-plugin nor csi\n",
                 inject.c_str());
    return 2;
  }
  o.mutate.csi_volume = inject == "csi";
  o.mutate.mount_path = absl::GetFlag(FLAGS_socket_mount_path);
  if (o.mutate.mount_path.empty() || o.mutate.mount_path[0] != '/') {
    std::fprintf(stderr, "weightcache-webhook: --socket_mount_path: '%s' is not absolute\n",
                 o.mutate.mount_path.c_str());
    return 2;
  }
  if (o.reload_interval <= absl::ZeroDuration()) {
    std::fprintf(stderr, "weightcache-webhook: --reload_interval must be positive\n");
    return 2;
  }
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  signal(SIGPIPE, SIG_IGN);
  auto server = webhook::Server::Start(o);
  if (!server.ok()) {
    std::fprintf(stderr, "weightcache-webhook: %s\n",
                 std::string(server.status().message()).c_str());
    return 2;
  }
  // The port line is what tests (and humans) read when --address asked for port 0.
  std::printf("weightcache-webhook: listening on port %d\n", (*server)->port());
  std::fflush(stdout);
  int sig = 0;
  sigwait(&sigs, &sig);
  WC_LOG_INFO("webhook: signal %d: exiting", sig);
  return 0;
}

}  // namespace
}  // namespace weightcache

int main(int argc, char** argv) {
  const std::string usage =
      "weightcache mutating admission webhook: adds the weightcache.io/client resource and the\n"
      "WEIGHTCACHE_MODEL / WEIGHTCACHE_FINGERPRINT env to pods annotated weightcache.io/model\n"
      "or weightcache.io/fingerprint.\n"
      "  weightcache-webhook --tls_cert_file=tls.crt --tls_key_file=tls.key\n"
      "Serves POST /mutate and GET /healthz over HTTPS until SIGTERM or SIGINT.";
  weightcache::HandleHelpFlag(argc, argv, usage, {"cmd/weightcache-webhook/"});
  absl::SetProgramUsageMessage(usage);
  absl::ParseCommandLine(argc, argv);
  return weightcache::Run();
}
