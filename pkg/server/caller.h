// Who calls the daemon: the vocabulary that the control listener (which learns it), the
// authorization policy (which decides on it) and the RPC handlers share. Depends on nothing
// of the server, so no part includes another's header for it.
//
// Thread-safety: plain values, copied freely.
#pragma once

#include <chrono>
#include <cstddef>
#include <string>

#include "pkg/util/unix_socket.h"

namespace weightcache::server {

// The socket a control connection came in on. Its kind decides which roles a peer can hold
// (policy.h): engine pods reach only kEngine (without namespace rules) or kSlot sockets;
// kAdmin lives in a directory that no engine pod mounts.
enum class SocketKind {
  kEngine,  // <socket_dir>/control.sock, the shared engine socket
  kSlot,    // <socket_dir>/slots/<slot>/control.sock (namespace rules): one pod each
  kAdmin,   // the admin socket (--admin_socket_dir): operators, never engine pods
};
// "engine socket" | "slot socket" | "admin socket"
const char* SocketKindName(SocketKind kind);

struct Caller {
  PeerCred cred;
  SocketKind socket = SocketKind::kEngine;
  std::string slot;  // kSlot: the slot id (e.g. weightcache-3); empty otherwise
  std::chrono::steady_clock::time_point accepted;
  bool over_cap = false;  // this uid held max_connections_per_uid already
  size_t uid_connections = 0;
};

}  // namespace weightcache::server
