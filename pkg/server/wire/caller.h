// Who calls the daemon: the vocabulary that the control listener (which learns it), the
// authorization policy (which decides on it) and the RPC handlers share. Depends on nothing
// of the server, so no part includes another's header for it.
//
// Thread-safety: plain values, copied freely.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <string>

#include "pkg/tenant/unit.h"
#include "pkg/util/unix_socket.h"

namespace weightcache::server {

// The socket a control connection came in on. Its kind decides which roles a peer can hold
// (policy.h): engine pods reach only kEngine (without namespace rules), kSlot or kPod sockets;
// kAdmin lives in a directory that no engine pod mounts.
enum class SocketKind {
  kEngine,  // <socket_dir>/control.sock, the shared engine socket
  kSlot,    // <socket_dir>/slots/<slot>/control.sock (namespace rules): one pod each
  kPod,     // a pod's own socket in its CSI volume: the pod the kubelet named (unit.pod_*)
  kAdmin,   // the admin socket (--admin_socket_dir): operators, never engine pods
};
// "engine socket" | "slot socket" | "admin socket"
const char* SocketKindName(SocketKind kind);

struct Caller {
  PeerCred cred;
  SocketKind socket = SocketKind::kEngine;
  // kSlot: the slot id (e.g. weightcache-3); kPod: "pod:<uid>" (tokens issued on a pod's
  // socket are claimed on the handle socket beside it only); empty otherwise.
  std::string slot;
  // The tenant unit (pod, slot or process) the connection belongs to: leases, caps, puts in
  // flight and Status are per unit (pkg/tenant/unit.h), never per uid.
  tenant::Unit unit;
  std::chrono::steady_clock::time_point accepted;
  bool over_cap = false;  // its unit held its cap already
  size_t unit_connections = 0;
  size_t unit_cap = 0;  // that cap: max_connections_per_pod, or _unresolved for that unit
  // The call (set by the gRPC adapter): whether its client gave up (cancelled, or its
  // deadline passed), and that deadline. Every wait ends at the earlier of it and the
  // daemon's own bound (issue 26: Acquires waiting on a load held a gRPC thread each for
  // the daemon's wait bound after their clients had left, until no thread served anyone).
  std::function<bool()> gone;
  std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max();
  std::chrono::steady_clock::time_point DeadlineOr(std::chrono::steady_clock::duration d) const {
    const auto own = std::chrono::steady_clock::now() + d;
    return deadline < own ? deadline : own;
  }
};

}  // namespace weightcache::server
