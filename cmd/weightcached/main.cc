// weightcached: the node daemon. Parses flags (flags.h), builds the object graph (backend,
// metrics, daemon, HTTP endpoint, optional kubelet device plugin), runs until SIGINT/SIGTERM.
#include <prometheus/registry.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "cmd/weightcached/flags.h"
#include "pkg/kube/csi_plugin.h"
#include "pkg/kube/device_plugin.h"
#include "pkg/memory/cuda_backend.h"
#include "pkg/metrics/http_server.h"
#include "pkg/metrics/metrics.h"
#include "pkg/server/daemon.h"
#include "pkg/util/flags_help.h"
#include "pkg/util/log.h"
#include "pkg/util/status_macros.h"
#include "pkg/util/version.h"

namespace weightcache {
namespace {

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "weightcached: %s\n", std::string(s.ToString()).c_str());
  return 2;
}

// Signals go to a dedicated thread (blocked here before any other thread starts).
sigset_t BlockShutdownSignals() {
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  signal(SIGPIPE, SIG_IGN);
  return sigs;
}

// /metrics, /healthz and /readyz on --metrics_address; ready when the daemon says so.
absl::StatusOr<std::unique_ptr<metrics::HttpServer>> StartHttp(
    const std::shared_ptr<prometheus::Registry>& registry, metrics::Metrics& metrics,
    const server::Daemon* d) {
  WC_ASSIGN_OR_RETURN(auto http, metrics::HttpServer::Start(absl::GetFlag(FLAGS_metrics_address)));
  http->RegisterCollectable(registry);
  http->RegisterCollectable(metrics.collectable());
  http->SetReadinessCheck([d] { return d->Readiness(); });
  // The port's door in weightcache_connections*{listener="metrics"}; detached before `http`
  // goes (Serve's shutdown).
  metrics.SetMoreListeners([h = http.get()] { return std::vector{h->listener()}; });
  return http;
}

// The kubelet device plugin (--device_plugin): engine pods that ask for the resource get the
// socket dir (with --namespace_rules, their slot's) mounted; healthy while the control socket
// exists.
absl::StatusOr<std::unique_ptr<kube::DevicePlugin>> StartDevicePlugin(
    const server::DaemonOptions& opts, const server::Daemon& daemon) {
  kube::DevicePlugin::Options po;
  po.kubelet_dir = absl::GetFlag(FLAGS_kubelet_dir);
  po.slots = absl::GetFlag(FLAGS_device_plugin_slots);
  po.resource_name = absl::GetFlag(FLAGS_device_plugin_resource);
  po.host_socket_dir = opts.socket_dir;
  po.container_socket_dir = opts.namespace_rules.container_socket_dir;  // checked absolute
  po.per_slot_dirs = opts.namespace_rules.enabled;
  std::string control = daemon.control_socket();
  po.healthy = [control] { return ::access(control.c_str(), F_OK) == 0; };
  WC_ASSIGN_OR_RETURN(auto plugin, kube::DevicePlugin::Create(po));
  WC_RETURN_IF_ERROR(plugin->Start());
  return plugin;
}

// The CSI node plugin (--csi_endpoint): an engine pod's inline volume becomes its own sockets.
absl::StatusOr<std::unique_ptr<kube::CsiPlugin>> StartCsiPlugin(server::Daemon& daemon) {
  kube::CsiPlugin::Options co;
  co.endpoint = absl::GetFlag(FLAGS_csi_endpoint);
  const std::string reg_dir = absl::GetFlag(FLAGS_csi_registration_dir);
  if (reg_dir != "none") co.registration = reg_dir + "/" + co.driver_name + "-reg.sock";
  co.pods_dir = absl::GetFlag(FLAGS_csi_pods_dir);
  co.vendor_version = Version();
  co.node_id = absl::GetFlag(FLAGS_node_name);
  if (const char* env = std::getenv("NODE_NAME"); co.node_id.empty() && env != nullptr) {
    co.node_id = env;
  }
  if (char host[256] = {}; co.node_id.empty() && ::gethostname(host, sizeof host - 1) == 0) {
    co.node_id = host;
  }
  return kube::CsiPlugin::Start(
      co, [&daemon](const kube::PodVolume& v) { return daemon.PublishPodVolume(v); },
      [&daemon](const std::string& id, const std::string& target) {
        return daemon.UnpublishPodVolume(id, target);
      });
}

// Runs until the daemon has shut down and `teardown` has destroyed what serves. The signal
// thread only asks for the shutdown; this thread runs it (in Wait) and the teardown. A
// watchdog on the signal thread bounds the whole: past --shutdown_timeout the process exits
// anyway, removing its sockets (engines keep what they mapped).
void RunUntilShutdown(const sigset_t& sigs, server::Daemon& daemon, double shutdown_timeout,
                      const std::function<void()>& teardown) {
  std::mutex done_mu;
  std::condition_variable done_cv;
  bool done = false;
  std::atomic<bool> signalled{false};
  const std::vector<std::string> sockets = {daemon.control_socket(), daemon.handle_socket(),
                                            daemon.admin_socket()};
  std::thread waiter([&] {
    int sig = 0;
    sigwait(&sigs, &sig);
    signalled = true;
    std::unique_lock<std::mutex> l(done_mu);
    if (done) return;  // woken by main after a shutdown from elsewhere
    WC_LOG_INFO("signal %d: shutting down (at most %.1f s)", sig, shutdown_timeout);
    daemon.Shutdown();
    if (!done_cv.wait_for(l, std::chrono::duration<double>(shutdown_timeout),
                          [&] { return done; })) {
      WC_LOG_ERROR("shutdown took longer than --shutdown_timeout=%.1f s; exiting now",
                   shutdown_timeout);
      for (const auto& p : sockets) ::unlink(p.c_str());
      std::_Exit(0);
    }
  });
  daemon.Wait();  // returns once the daemon has shut down
  teardown();
  {
    std::lock_guard<std::mutex> l(done_mu);
    done = true;
  }
  done_cv.notify_all();
  // Unblock the signal thread if shutdown came from elsewhere.
  // NOLINTNEXTLINE(bugprone-bad-signal-to-kill-thread): it sigwait()s for SIGTERM and returns
  if (!signalled) pthread_kill(waiter.native_handle(), SIGTERM);
  waiter.join();
}

// Builds the object graph on `backend` (metrics, the daemon, its HTTP endpoint, the device
// plugin) and runs it until shutdown.
int Serve(server::DaemonOptions& opts, memory::Backend& backend, double shutdown_timeout) {
  const sigset_t sigs = BlockShutdownSignals();
  auto registry = std::make_shared<prometheus::Registry>();
  metrics::Metrics metrics(
      *registry, {Version(), memory::CudaVersionBuiltWith(), memory::BackendName(backend.kind())});
  opts.metrics = &metrics;

  auto daemon = server::Daemon::Start(opts, &backend);
  if (!daemon.ok()) return Fail(daemon.status());
  metrics.SetStateSource((*daemon)->state_source());

  std::unique_ptr<metrics::HttpServer> http;
  if (absl::GetFlag(FLAGS_metrics_address) != "off") {
    auto h = StartHttp(registry, metrics, daemon->get());
    if (!h.ok()) return Fail(h.status());
    http = std::move(h).value();
  }
  std::unique_ptr<kube::DevicePlugin> plugin;
  if (absl::GetFlag(FLAGS_device_plugin)) {
    auto p = StartDevicePlugin(opts, **daemon);
    if (!p.ok()) return Fail(p.status());
    plugin = std::move(p).value();
  }

  std::unique_ptr<kube::CsiPlugin> csi;
  if (!absl::GetFlag(FLAGS_csi_endpoint).empty()) {
    auto c = StartCsiPlugin(**daemon);
    if (!c.ok()) return Fail(c.status());
    csi = std::move(c).value();
  }

  RunUntilShutdown(sigs, **daemon, shutdown_timeout, [&] {
    if (csi) csi->Stop();
    if (plugin) plugin->Stop();
    metrics.SetMoreListeners(nullptr);
    http.reset();
    metrics.SetStateSource(nullptr);
    daemon->reset();
  });
  WC_LOG_INFO("exiting");
  return 0;
}

// Flags -> options -> backend -> the daemon, run until SIGINT/SIGTERM. Exit code 2, with the
// message naming the flag, when one is bad or anything fails to start.
int Run() {
  if (absl::GetFlag(FLAGS_verbose)) SetLogLevel(LogLevel::kDebug);
  auto options = OptionsFromFlags();
  if (!options.ok()) return Fail(options.status());
  auto backend = BackendFromFlags();
  if (!backend.ok()) return Fail(backend.status());
  if (absl::Status s = SetMemoryBudget(**backend, options->daemon); !s.ok()) return Fail(s);
  return Serve(options->daemon, **backend, options->shutdown_timeout);
}

}  // namespace
}  // namespace weightcache

int main(int argc, char** argv) {
  const std::string usage =
      "weightcache node daemon: keeps model weights resident and serves them zero-copy.\n"
      "  weightcached --socket_dir=/run/weightcache --spec_file=/etc/weightcache/models.yaml\n"
      "Runs until SIGTERM or SIGINT; control with weightcachectl.";
  weightcache::HandleHelpFlag(argc, argv, usage, {"cmd/weightcached/"});
  absl::SetProgramUsageMessage(usage);
  // A flag given twice keeps only its last value; for --model (one spec each) that silently
  // drops models, so it is refused.
  int models = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    models += a == "--model" || a.rfind("--model=", 0) == 0;
  }
  if (models > 1) {
    std::fprintf(stderr,
                 "weightcached: --model given %d times; it holds one spec, and only the last "
                 "would be read: put several models in a --spec_file\n",
                 models);
    return 2;
  }
  absl::ParseCommandLine(argc, argv);
  return weightcache::Run();
}
