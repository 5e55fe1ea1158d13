// The weightcache daemon's serving core: the gRPC control service on control.sock, the
// handle channel on handle.sock, the registry, the memory backend and the known specs.
// main() builds one Daemon, runs it until a signal, and destroys it.
//
// Thread-safety: every public method may be called from any thread. gRPC handlers run on
// gRPC's threads; loads on registry threads; the handle channel on its own thread.
// Lifetimes: the backend and (optional) metrics passed in must outlive the Daemon.
#pragma once

#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "pkg/kube/pod_volume.h"
#include "pkg/memory/backend.h"
#include "pkg/server/options.h"

namespace weightcache::metrics {
class Metrics;
class StateSource;
}  // namespace weightcache::metrics

namespace weightcache::server {

class DaemonHooks;
namespace testing {
class DaemonHooksAccess;
}  // namespace testing

class PodVolumes;

class Daemon {
 public:
  // Prepares the socket dir (0750), removes stale sockets safely, starts serving, and
  // starts preloads. ALREADY_EXISTS when another daemon answers on the sockets.
  static absl::StatusOr<std::unique_ptr<Daemon>> Start(DaemonOptions options,
                                                       memory::Backend* backend);
  ~Daemon();
  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;

  std::string control_socket() const;
  std::string admin_socket() const;  // "" without one
  std::string handle_socket() const;
  // The TCP port the peer API listens on; 0 when it is off.
  int peer_port() const;
  // Ready when every preloaded model is ready or failed for good; the reason otherwise.
  std::pair<bool, std::string> Readiness() const;
  // What the scrape-time metrics read; lives as long as the Daemon.
  const metrics::StateSource* state_source() const;
  // Blocks until Shutdown() has been asked (from another thread, e.g. the signal thread),
  // then shuts down in order — cancel loads and waits, stop accepting, drain RPCs within
  // shutdown_grace, close the handle channel, remove the sockets — and returns when done.
  // The destructor does the same when Wait() was never called.
  void Wait();
  // Asks for the shutdown; returns at once. Safe from any thread.
  void Shutdown();

  // The CSI plugin's calls (pkg/kube/csi_plugin.h): a pod's own control and handle sockets
  // in its volume's directory, every connection on them that pod's (wire/pod_volumes.h).
  // From any thread, until Shutdown.
  absl::Status PublishPodVolume(const kube::PodVolume& volume);
  absl::Status UnpublishPodVolume(const std::string& volume_id, const std::string& target_path);

  class Impl;

 private:
  // Start with test hooks (hooks.h): reachable only through pkg/server/testing/hooks.h.
  friend class testing::DaemonHooksAccess;
  static absl::StatusOr<std::unique_ptr<Daemon>> StartWithHooks(DaemonOptions options,
                                                                memory::Backend* backend,
                                                                DaemonHooks* hooks);
  explicit Daemon(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
  PodVolumes* const pod_volumes_;  // impl_'s (the CSI plugin's calls, daemon_pods.cc)
};

}  // namespace weightcache::server
