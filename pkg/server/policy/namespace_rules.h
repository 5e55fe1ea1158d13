// Per-model namespace rules (--namespace_rules): a model whose spec lists allowed_namespaces may
// be mapped only from pods of those Kubernetes namespaces.
//
// Who calls is known without hostPID or the API server: the device plugin gives every engine
// container one slot (a device id, e.g. weightcache-3) and mounts only that slot's socket
// directory (<socket_dir>/slots/<id>/), so the daemon knows the slot of each connection
// (ControlListener::Caller::slot); the kubelet's PodResources API says which pod holds the
// slot, and so its namespace. See docs/security.md for the trust model.
//
// The rule, for a model with a non-empty allowed_namespaces (an empty list is open to all):
//   - a connection on a slot socket: allowed when the pod holding the slot is in the list;
//     denied when it is not, when no pod holds the slot, when PodResources cannot be asked or
//     when two pods claim the slot (fail closed). Admin uids get no exception on slot sockets.
//   - a connection on the shared socket (reachable only through a hostPath, i.e. the daemon's
//     own pod or node tooling): allowed for admin peers, denied for anyone else (nothing there
//     identifies a pod).
// Caching: one List answers for every slot. An answer serves a connection only if it was
// obtained after that connection was accepted (and is younger than cache_ttl): a pod that
// took over a slot connects after its predecessor's answer, so it is always asked about
// afresh, and a stale "allowed" cannot outlive the slot's holder. Failures are never cached.
//
// Thread-safety: every method may be called from any thread (gRPC handler threads).
// Lifetimes: the lookup function is owned; it may block up to its own timeout.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "pkg/kube/pod_resources.h"
#include "pkg/server/policy/namespace_rules_options.h"
#include "pkg/util/mutex.h"

namespace weightcache::server {

class NamespaceRules {
 public:
  // One PodResources List for the slot resource: device id -> pod.
  using Lookup = std::function<absl::StatusOr<kube::DeviceHolders>()>;
  struct Options {
    std::string resource_name = "weightcache.io/client";  // the device plugin's resource
    std::chrono::milliseconds cache_ttl{2000};
  };
  NamespaceRules(Options options, Lookup lookup);
  // The daemon's rules: PodResources asked on options.pod_resources_socket. INVALID_ARGUMENT
  // for a bad socket path.
  static absl::StatusOr<std::unique_ptr<NamespaceRules>> Create(
      const NamespaceRulesOptions& options);

  // Who asks: the slot of the connection (empty: the shared socket), when it was accepted,
  // and whether its peer is an admin uid.
  struct Who {
    std::string slot;
    std::chrono::steady_clock::time_point accepted;
    bool admin = false;
  };
  // OK when `who` may map `model`, whose spec allows `allowed` (empty: everyone);
  // PERMISSION_DENIED naming the model, the rule and the pod (or why it is unknown) otherwise.
  absl::Status MayMap(const Who& who, const std::string& model,
                      const std::vector<std::string>& allowed);

  // The pod holding `slot`, answered no earlier than `accepted` and within cache_ttl (asks
  // PodResources otherwise). NOT_FOUND when no pod holds it, FAILED_PRECONDITION when two do,
  // the lookup's error when the kubelet cannot be asked.
  absl::StatusOr<kube::PodRef> PodOf(const std::string& slot,
                                     std::chrono::steady_clock::time_point accepted);

  // PodResources List calls made so far (tests: the cache at work).
  uint64_t lookups() const;

 private:
  struct Cached {
    kube::PodRef pod;
    std::chrono::steady_clock::time_point fetched;
  };
  const Options options_;
  const Lookup lookup_;
  mutable Mutex mu_;
  std::map<std::string, Cached> by_slot_ ABSL_GUARDED_BY(mu_);
  uint64_t lookups_ ABSL_GUARDED_BY(mu_) = 0;
};

// One slot's sockets on the host.
struct SlotSockets {
  std::string slot;  // the device id, e.g. weightcache-3
  std::string dir, control, handle;
};
// Creates <socket_dir>/slots/ and one directory per slot (0750; group `socket_gid` when >= 0)
// where missing, uses existing ones as they are when safe (PrepareSocketDir: never chmod'ed
// or chown'ed), and removes stale sockets in them (ALREADY_EXISTS when a live daemon answers
// there; anything but a socket is refused, not removed).
absl::StatusOr<std::vector<SlotSockets>> PrepareSlotDirs(const std::string& socket_dir, int slots,
                                                         int socket_gid);
// The handle socket as an engine on a slot sees it: its slot's directory is mounted at
// --container_socket_dir (`rules.container_socket_dir`; empty: the socket dir's own path).
std::string SlotHandleSocketInContainer(const std::string& socket_dir,
                                        const NamespaceRulesOptions& rules);
// How messages name the socket a connection came in on: "slot weightcache-1's socket", or
// "the shared socket" for an empty slot.
std::string SocketOfSlot(const std::string& slot);
// Gives the slots' sockets group `socket_gid` (after they were created).
absl::Status GroupSlotSockets(const std::vector<SlotSockets>& slots, int socket_gid);

}  // namespace weightcache::server
