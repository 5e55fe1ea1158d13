// The kubelet device plugin (Device Plugin API v1beta1) that lets engine pods reach the daemon
// without a hostPath of their own.
//
// It advertises `slots` interchangeable devices ("weightcache-0" .. "weightcache-<slots-1>") of
// the extended resource `resource_name` (default weightcache.io/client). A pod that requests one
// gets, through Allocate, a bind mount of the daemon's engine-facing socket DIRECTORY
// (host_socket_dir -> container_socket_dir, writable so the client can connect) and the env
// WEIGHTCACHE_SOCKET=<container_socket_dir>/control.sock. Mounts added by a device plugin are
// not part of the pod spec, so this works under Pod Security "baseline", which forbids hostPath.
// With `per_slot_dirs` (the daemon's --namespace_rules) each device id is a slot with its own
// socket directory, <host_socket_dir>/slots/<id>, and Allocate mounts that one instead of the
// shared directory: a container sees only its own slot's sockets, so the daemon knows the slot
// of every connection, and the kubelet's PodResources API says which pod holds the slot.
//
// Life cycle:
//   Start(): serves the DevicePlugin gRPC service on <kubelet_dir>/<endpoint> FIRST (the kubelet
//     dials back while Register runs), then calls Register on <kubelet_dir>/kubelet.sock. A
//     kubelet that is not there yet is not an error: the watcher registers once kubelet.sock
//     appears.
//   While running, one watcher thread (inotify on kubelet_dir, plus a poll every
//   `poll_interval` as a fallback) notices
//     - kubelet.sock being created again (a restarting kubelet) -> Register again;
//     - our own socket vanishing (a restarting kubelet deletes every socket in the dir) ->
//       serve a fresh socket, then Register again;
//     - a change of `healthy()` -> ListAndWatch streams re-send the device list.
//   Stop(): reports every device Unhealthy on open ListAndWatch streams, ends them, stops the
//     server and removes our socket. Idempotent; the destructor calls it.
//
// Thread-safety: Create/Start/Stop/destructor are for the owning thread. registrations(),
// registered() and healthy() may be called from any thread. `Options::healthy` is called from
// the watcher thread (and once from Start); it must be thread-safe, quick and must not call back
// into this object.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "pkg/util/scoped_fd.h"

namespace grpc {
class Server;
}

namespace weightcache::kube {

inline constexpr char kDevicePluginApiVersion[] = "v1beta1";
inline constexpr char kKubeletSocketName[] = "kubelet.sock";
// File names inside the engine-facing socket directory (set by the server; contract).
inline constexpr char kControlSocketName[] = "control.sock";
inline constexpr char kHandleSocketName[] = "handle.sock";
// The env var Allocate sets; the client library reads it.
inline constexpr char kSocketEnv[] = "WEIGHTCACHE_SOCKET";
inline constexpr char kHealthy[] = "Healthy";
inline constexpr char kUnhealthy[] = "Unhealthy";
// Per-slot socket directories live under <socket_dir>/<kSlotsDirName>/<device id>.
inline constexpr char kSlotsDirName[] = "slots";

// The device id of slot `index`: "weightcache-<index>" (contract: PodResources reports it).
std::string DeviceId(int index);
// A slot's own socket directory on the host: <socket_dir>/slots/<device_id>.
std::string SlotSocketDir(const std::string& socket_dir, const std::string& device_id);

class DevicePluginService;  // the gRPC service, defined in device_plugin.cc

class DevicePlugin {
 public:
  struct Options {
    // The kubelet's device-plugins directory: holds kubelet.sock and our endpoint socket.
    std::string kubelet_dir = "/var/lib/kubelet/device-plugins";
    std::string resource_name = "weightcache.io/client";
    // How many pods may hold the resource on this node at once.
    int slots = 64;
    // Our socket's file name inside kubelet_dir.
    std::string endpoint = "weightcache.sock";
    // The daemon's engine-facing socket directory on the host (holds control.sock and
    // handle.sock), and where Allocate mounts it in the container (empty: the same path).
    std::string host_socket_dir = "/run/weightcache";
    std::string container_socket_dir;
    // Allocate mounts the slot's own directory, SlotSocketDir(host_socket_dir, id), at
    // container_socket_dir; a container must then ask for exactly one device.
    bool per_slot_dirs = false;
    // Whether the daemon can serve; null means always healthy.
    std::function<bool()> healthy;
    // How often health and the sockets are checked when no inotify event arrives.
    absl::Duration poll_interval = absl::Seconds(1);
    // Deadline of one Register call.
    absl::Duration register_timeout = absl::Seconds(5);
  };

  // Validates the options (absolute paths, socket path length, resource name shape, slots in
  // [1, 1e5]); INVALID_ARGUMENT naming the field otherwise. Touches nothing on disk.
  static absl::StatusOr<std::unique_ptr<DevicePlugin>> Create(Options options);

  DevicePlugin(const DevicePlugin&) = delete;
  DevicePlugin& operator=(const DevicePlugin&) = delete;
  ~DevicePlugin();

  // Serves our socket, tries to Register, starts the watcher. Errors: kubelet_dir missing or
  // not writable, the server could not bind. A failed Register is logged and retried, not
  // returned. Call at most once, and not after Stop() (FAILED_PRECONDITION).
  absl::Status Start();
  // See the file comment. Safe to call without Start() and more than once.
  void Stop();

  // Successful Register calls so far (for tests and logs).
  int64_t registrations() const;
  // The last Register succeeded and neither socket has changed since.
  bool registered() const;
  // Waits until registrations() >= n or `timeout` passes; returns whether it got there.
  bool WaitForRegistrations(int64_t n, absl::Duration timeout) const;
  // Health as last polled.
  bool healthy() const;

  const Options& options() const { return options_; }
  std::string endpoint_path() const;
  std::string kubelet_socket_path() const;
  std::vector<std::string> DeviceIds() const;

 private:
  friend class DevicePluginService;

  // Identity of a file on disk, to see a socket deleted and created again even when the inode
  // number is reused.
  struct FileId {
    dev_t dev = 0;
    ino_t ino = 0;
    int64_t ctime_ns = 0;
    bool exists = false;
    bool operator==(const FileId&) const = default;
  };
  static FileId Stat(const std::string& path);

  explicit DevicePlugin(Options options);

  // These run on the owning thread in Start/Stop or on the watcher thread, never both at once.
  absl::Status Serve();
  void StopServer();
  absl::Status Register();
  void TryRegister(bool force);
  void WatchLoop();
  bool PollHealth();

  const Options options_;

  // Control state: touched by Start(), then only by the watcher thread, then by Stop() after
  // the watcher has been joined; never by two threads at once, so not under mu_.
  std::unique_ptr<DevicePluginService> service_;
  std::unique_ptr<grpc::Server> server_;
  FileId our_socket_;
  FileId registered_kubelet_;        // kubelet.sock as it was when Register last succeeded
  int watch_wd_ = -1;                // inotify watch on kubelet_dir; -1: none (polling only)
  std::string last_register_error_;  // logged once until it changes
  ScopedFd inotify_fd_;
  ScopedFd wake_fd_;  // eventfd: Stop() wakes the watcher
  std::thread watcher_;
  bool started_ = false;

  // Shared with the gRPC handler threads and the accessors.
  mutable absl::Mutex mu_;
  // Signalled whenever generation_, server_epoch_, stopping_ or registrations_ changes.
  mutable absl::CondVar cv_;
  bool healthy_ ABSL_GUARDED_BY(mu_) = true;
  // Bumped on every health change: ListAndWatch streams re-send when it moves.
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  // Bumped when the server is replaced: streams of an older server end.
  uint64_t server_epoch_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool registered_ ABSL_GUARDED_BY(mu_) = false;
  int64_t registrations_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace weightcache::kube
