// The control socket's listener. gRPC's own Unix listener hides who connects, and when the
// process runs out of descriptors it stops accepting for good. This listener accepts each
// connection itself: it reads the peer's credentials (SO_PEERCRED), applies the uid
// allowlist and the connection caps, and hands the connection to gRPC through a relay that
// bounds the HTTP/2 streams it may hold (connection_relay.h; the relay's end of a socket pair
// goes to `serve`, e.g. grpc::AddInsecureChannelFromFd); RPC handlers then learn who calls
// through PeerOf(). It knows descriptors and credentials, not gRPC.
// On EMFILE/ENFILE it backs off (100 ms) and keeps accepting once descriptors are back.
// Besides control.sock it may serve one socket per device-plugin slot (namespace rules): each
// connection remembers the socket it came in on, and PeerOf() reports that slot. The tie is
// the descriptor gRPC holds (its peer string "fd:N", the relay's end of the socket pair) and
// that socket's inode, recorded before gRPC gets the descriptor: a reused descriptor number
// has another inode and is never taken for the old connection (connection_table.h).
// Not a public header.
//
// Thread-safety: Start/StopAccepting/destructor from one thread; PeerOf, counters and
// healthy from any, until the destructor.
// Lifetimes: what `serve` hands the descriptors to (the gRPC server) outlives the accepting
// (StopAccepting or destroy the listener first). Shutting down: StopAccepting, then drain gRPC (its
// calls still learn their callers and their answers still reach the clients through the relay),
// then destroy the listener, which closes the connections.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "pkg/server/wire/caller.h"
#include "pkg/server/wire/connection_relay.h"
#include "pkg/server/wire/connection_table.h"
#include "pkg/tenant/resolve.h"
#include "pkg/util/mutex.h"
#include "pkg/util/scoped_fd.h"
#include "pkg/util/unix_socket.h"

namespace weightcache::server {

class ControlListener {
 public:
  struct Options {
    std::string path;  // control.sock (created; removed by the destructor)
    // Further sockets, one per slot (created 0660 like `path`, removed by the destructor);
    // their connections carry the slot id.
    struct SlotSocket {
      std::string slot;
      std::string path;
    };
    std::vector<SlotSocket> slot_sockets;
    // The admin socket (created 0600; removed by the destructor); empty: none. Its
    // connections are SocketKind::kAdmin (policy.h).
    std::string admin_path;
    std::vector<uid_t> allowed_uids;  // empty: anyone who can reach the socket
    // Connections open at once: past `max_connections` new ones are closed at once; a tenant
    // unit (the peer's pod, its slot, or the process: pkg/tenant) past
    // `max_connections_per_pod` is served only RESOURCE_EXHAUSTED answers (see
    // Caller::over_cap) on up to `over_cap_held` connections so it learns why, and past
    // those its new connections are closed at accept.
    size_t max_connections = 2048;
    size_t max_connections_per_pod = 256;
    // The cap of the one unit all unresolved peers share (pkg/tenant: gone, a zombie or not
    // visible at accept) in place of max_connections_per_pod: a pod whose children connect
    // and exit at once holds this many, not the node's whole table.
    size_t max_connections_unresolved = 16;
    size_t over_cap_held = 4;
    // Where the peers' /proc entries are read to resolve their pods (tests: a fixture tree).
    std::string proc_root = "/proc";
    // HTTP/2 streams one connection may hold open (connection_relay.h): past it, closed.
    size_t max_streams_per_connection = 64;
    // Told of each connection the relay closed for a limit (ConnectionRelay::Options).
    std::function<void(const std::string& limit)> on_relay_closed;
  };
  // Takes an accepted connection's descriptor (the relay's end) and owns it from then on:
  // the RPC server that answers on it. Called on the listener's thread.
  using Serve = std::function<void(int fd)>;
  static absl::StatusOr<std::unique_ptr<ControlListener>> Start(Options options, Serve serve);
  ~ControlListener();
  // Stops accepting and removes the sockets; the connections already accepted are still
  // relayed and PeerOf still answers for them. Idempotent.
  void StopAccepting();
  // StopAccepting, and closes every connection (the relay). PeerOf answers nothing after.
  void CloseConnections();
  ControlListener(const ControlListener&) = delete;
  ControlListener& operator=(const ControlListener&) = delete;

  using Caller = server::Caller;
  // The caller behind gRPC's peer string ("fd:N"); nullopt when unknown.
  std::optional<Caller> PeerOf(const std::string& grpc_peer) const;

  struct Counters {
    uint64_t accepted = 0;
    uint64_t refused_uid = 0;       // not in the allowlist: closed
    uint64_t refused_total = 0;     // past max_connections: closed
    uint64_t refused_unit_cap = 0;  // past a unit's cap and its over-cap connections: closed
    uint64_t accept_errors = 0;     // EMFILE and the like (backed off, retried)
    size_t open = 0;
  };
  Counters counters() const;
  // False while accepting fails (out of descriptors); /readyz reports it.
  bool healthy() const { return healthy_.load(); }
  const Options& options() const { return options_; }

 private:
  struct Listening {
    ScopedFd fd;
    std::string slot;  // empty: the shared socket
    SocketKind kind = SocketKind::kEngine;
  };
  ControlListener(Options options, std::vector<Listening> listening, ScopedFd wake,
                  std::unique_ptr<ConnectionRelay> relay, Serve serve);
  void Loop();
  // Accepts what is pending on `l`; false when accepting must back off (out of descriptors).
  bool AcceptFrom(const Listening& l);
  // Marks the listener healthy again when a descriptor can be had (after EMFILE).
  void ProbeDescriptors();
  void Reap() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Options options_;
  const tenant::Resolver resolver_;
  std::vector<Listening> listening_;  // [0]: control.sock
  ScopedFd wake_;
  std::unique_ptr<ConnectionRelay> relay_;
  const Serve serve_;
  std::atomic<bool> healthy_{true};
  std::atomic<bool> stop_{false};
  mutable Mutex mu_;
  ConnectionTable conns_ ABSL_GUARDED_BY(mu_);  // by descriptor number (gRPC owns it)
  Counters counters_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace weightcache::server
