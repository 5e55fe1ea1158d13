// The control socket's listener. gRPC's own Unix listener hides who connects, and when the
// process runs out of descriptors it stops accepting for good. This listener takes each
// connection from the acceptor (pkg/net/acceptor.h: caps per tenant unit and in total, a
// first-byte deadline, EMFILE back-off, refusals counted by reason), which asks it who the
// peer is: its credentials (SO_PEERCRED), the uid allowlist, and its tenant unit. It hands the
// connection to gRPC through a relay that bounds the HTTP/2 streams it may hold
// (connection_relay.h; the relay's end of a socket pair goes to `serve`, e.g.
// grpc::AddInsecureChannelFromFd); RPC handlers then learn who calls through PeerOf(). It knows
// descriptors and credentials, not gRPC.
// Besides control.sock it may serve one socket per device-plugin slot (namespace rules): each
// connection remembers the socket it came in on, and PeerOf() reports that slot. The tie is
// the descriptor gRPC holds (its peer string "fd:N", the relay's end of the socket pair) and
// that socket's inode, recorded before gRPC gets the descriptor: a reused descriptor number
// has another inode and is never taken for the old connection (connection_table.h). A
// connection's place in the caps is held by the relay until the connection ends.
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
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "pkg/net/acceptor.h"
#include "pkg/server/wire/caller.h"
#include "pkg/server/wire/connection_relay.h"
#include "pkg/server/wire/connection_table.h"
#include "pkg/server/wire/pod_sockets.h"
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
    // A client that sends nothing (a gRPC client sends its preface at once) is closed then.
    std::chrono::milliseconds first_byte{10000};
    // A connection with no call in flight (no HTTP/2 stream open: a lease watch is one) and
    // no byte either way for this long is ended by the acceptor; the client reconnects when
    // it next calls. 0: never.
    std::chrono::milliseconds idle{30 * 60 * 1000};
    // Told of each connection refused at the door, by reason (net::ListenerOptions).
    std::function<void(const std::string& reason)> on_refused;
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

  // A pod's own socket (its CSI volume, pkg/kube/csi_plugin.h): created 0666 at `path` (its
  // directory is that pod's alone) and accepted on from now on; every connection on it is
  // `pod`'s (SocketKind::kPod), whatever its process. Replaces the pod's earlier socket.
  absl::Status AddPodSocket(const std::string& path, const tenant::Unit& pod);
  // Stops accepting on pod `uid`'s socket and removes it; its connections stay until they end.
  void RemovePodSocket(const std::string& uid);

  using Caller = server::Caller;
  // The caller behind gRPC's peer string ("fd:N"); nullopt when unknown.
  std::optional<Caller> PeerOf(const std::string& grpc_peer) const;

  // accepted, refused by reason ("identity": not in the allowlist; "total"; "per_key": past a
  // unit's cap and its over-cap connections; "first_byte"; "descriptors"), open.
  using Counters = net::Acceptor::Counters;
  Counters counters() const { return acceptor_->counters(); }
  // False while accepting fails (out of descriptors); /readyz reports it.
  bool healthy() const { return acceptor_->healthy(); }
  const Options& options() const { return options_; }

 private:
  ControlListener(Options options, std::unique_ptr<ConnectionRelay> relay, Serve serve);
  absl::StatusOr<net::Identity> Identify(int fd, const std::string& tag);
  bool Take(net::Accepted a);

  const Options options_;
  const tenant::Resolver resolver_;
  std::unique_ptr<ConnectionRelay> relay_;
  const Serve serve_;
  std::unique_ptr<net::Acceptor> acceptor_;
  mutable Mutex mu_;
  ConnectionTable conns_ ABSL_GUARDED_BY(mu_);  // by descriptor number (gRPC owns it)
  std::chrono::steady_clock::time_point next_reap_ ABSL_GUARDED_BY(mu_);
  bool stopped_ = false;
  PodSocketBook pods_;
};

}  // namespace weightcache::server
