// The weightcache daemon's serving core: the gRPC control service on control.sock, the
// handle channel on handle.sock, the registry, the memory backend and the known specs.
// main() builds one Daemon, runs it until a signal, and destroys it.
//
// Thread-safety: every public method may be called from any thread. gRPC handlers run on
// gRPC's threads; loads on registry threads; the handle channel on its own thread.
// Lifetimes: the backend and (optional) metrics passed in must outlive the Daemon.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "pkg/memory/backend.h"
#include "pkg/spec/spec.h"

namespace weightcache::metrics {
class Metrics;
class StateSource;
}

namespace weightcache::server {

inline constexpr const char* kDefaultSocketDir = "/run/weightcache";
inline constexpr const char* kControlSocketName = "control.sock";
inline constexpr const char* kHandleSocketName = "handle.sock";
inline constexpr const char* kVersion = "0.1.0";

struct DaemonOptions {
  std::string socket_dir = kDefaultSocketDir;
  std::vector<spec::ModelSpec> specs;  // known models; preloaded when `preload`
  bool preload = true;
  uint64_t memory_budget_bytes = 0;  // 0: unlimited
  std::vector<uid_t> allowed_uids;   // handle channel allowlist; empty: any
  int socket_gid = -1;  // >= 0: group owning the socket dir and sockets (engines' group)
  std::chrono::seconds token_ttl{30};
  std::chrono::seconds acquire_wait{600};  // wait_ready / load_on_miss bound
  unsigned read_threads = 8;
  metrics::Metrics* metrics = nullptr;  // optional
};

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
  std::string handle_socket() const;
  // Ready when every preloaded model is ready or failed for good; the reason otherwise.
  std::pair<bool, std::string> Readiness() const;
  // What the scrape-time metrics read; lives as long as the Daemon.
  const metrics::StateSource* state_source() const;
  // Blocks until Shutdown() (from another thread or a signal handler thread).
  void Wait();
  void Shutdown();

  class Impl;

 private:
  explicit Daemon(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace weightcache::server
