// The handle channel: a Unix socket (handle.sock) on which a client presents the one-time
// token from Acquire and receives the lease's segment descriptors with SCM_RIGHTS.
// That connection *is* the lease: when it closes (client exit, crash, SIGKILL) the lease
// ends, so a dead engine never pins memory.
//
// Wire protocol (version 1, all lines end in '\n', at most 256 bytes):
//   client -> daemon   "WCH1 <token>"
//   daemon -> client   "FDS <k>" carrying k descriptors (repeated until every segment of
//                      the lease went), or "ERR <message>" and close.
//   afterwards the client keeps the connection open and sends nothing; EOF ends the lease.
//   daemon -> client   "EVENT <kind> <message>" at any later time (handle_message.h): the
//                      lease's memory is corrupt (integrity scrubbing); the client reads it
//                      when it checks its lease.
//
// Besides `path` it may serve one socket per device-plugin slot (namespace rules): the claim
// callback is told which socket the token came in on ("" for `path`), so a token issued on
// one slot's control socket can be refused on another slot's handle socket.
//
// Connections come through the acceptor (pkg/net/acceptor.h): caps per tenant unit and in
// total (a refused peer is answered "ERR RESOURCE_EXHAUSTED: ..."), a first-byte deadline
// (the handshake timeout: "ERR DEADLINE_EXCEEDED: handshake timed out"), EMFILE back-off.
//
// Thread-safety: one internal thread runs the poll loop and calls the callbacks; public
// methods may be called from any thread. The destructor stops the thread and closes
// every connection (which ends their leases through CloseFn).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "pkg/net/acceptor.h"
#include "pkg/server/wire/pod_sockets.h"
#include "pkg/tenant/resolve.h"
#include "pkg/util/mutex.h"
#include "pkg/util/scoped_fd.h"
#include "pkg/util/unix_socket.h"

namespace weightcache::server {

class HandleChannel {
 public:
  struct Grant {
    std::string lease_id;
    std::vector<int> fds;  // borrowed; valid while `keepalive` lives
    std::shared_ptr<const void> keepalive;
  };
  // Turns a token into the lease's descriptors; an error is sent back as "ERR ...". `slot`:
  // the slot of the socket the connection came in on, empty for `path`.
  using ClaimFn = std::function<absl::StatusOr<Grant>(
      const std::string& token, const PeerCred& peer, const std::string& slot)>;
  // A lease's connection closed.
  using CloseFn = std::function<void(const std::string& lease_id)>;
  // Called about every 200 ms from the loop (token expiry and the like).
  using TickFn = std::function<void()>;

  struct Options {
    std::string path;
    // Further sockets served by the same loop, one per slot (created with `mode`, removed by
    // the destructor like `path`).
    struct SlotSocket {
      std::string slot;
      std::string path;
    };
    std::vector<SlotSocket> slot_sockets;
    mode_t mode = 0660;
    std::vector<uid_t> allowed_uids;  // empty: any peer that can reach the socket
    // Connections open at once, in all and per tenant unit (the peer's pod, slot or process:
    // pkg/tenant; leases included): past either cap a new connection is answered
    // "ERR RESOURCE_EXHAUSTED: ..." and closed, so one pod cannot crowd out the others (issue
    // 47: per uid, one root pod's 1,100 idle connections left every other pod 0/5 claims).
    // Connections silent past the handshake timeout (5 s) are closed.
    size_t max_connections = 4096;
    size_t max_connections_per_pod = 1024;
    // The cap of the one unit all unresolved peers share (pkg/tenant: gone, a zombie or not
    // visible at accept), in place of max_connections_per_pod.
    size_t max_connections_unresolved = 16;
    std::chrono::milliseconds handshake_timeout{5000};
    // Where the peers' /proc entries are read to resolve their pods (tests: a fixture tree).
    std::string proc_root = "/proc";
    // Told of each connection refused at the door, by reason (net::ListenerOptions).
    std::function<void(const std::string& reason)> on_refused;
  };

  static absl::StatusOr<std::unique_ptr<HandleChannel>> Start(const Options& options, ClaimFn claim,
                                                              CloseFn close, TickFn tick);
  ~HandleChannel();
  HandleChannel(const HandleChannel&) = delete;
  HandleChannel& operator=(const HandleChannel&) = delete;

  // Ends a lease from the daemon side (Release RPC): closes its connection if any.
  void CloseLease(const std::string& lease_id);
  // Sends `line` (FormatEventLine) on the lease's connection, without blocking the loop; a
  // lease with no connection (yet, or any longer) is skipped.
  void Notify(const std::string& lease_id, std::string line);

  // A pod's own handle socket (its CSI volume), beside its control socket: created 0666 at
  // `path`; its connections are `pod`'s, and present tokens with the slot "pod:<uid>" (the
  // tag its control socket gives them). Replaces the pod's earlier socket.
  absl::Status AddPodSocket(const std::string& path, const tenant::Unit& pod);
  // Stops accepting on pod `uid`'s socket and removes it; its connections stay until they end.
  void RemovePodSocket(const std::string& uid);

  // accepted, refused by reason, open (net::Acceptor::Counters).
  net::Acceptor::Counters counters() const { return acceptor_->counters(); }

 private:
  // One connection: its socket, what it sent so far and its lease (handle_channel.cc). The
  // loop thread owns them all, by descriptor.
  struct Conn;
  using Conns = std::map<int, Conn>;

  HandleChannel(Options options, ScopedFd wake, ClaimFn claim, CloseFn close, TickFn tick);
  absl::StatusOr<net::Identity> Identify(int fd, const std::string& slot) const;
  void Loop();
  // The loop's steps; they run on its thread only.
  void EndConn(Conns& conns, Conns::iterator it);
  void SendEvents(const Conns& conns, const std::multimap<std::string, std::string>& notifying);
  void CloseLeases(Conns& conns, const std::set<std::string>& closing);
  void EndStaleHandshakes(Conns& conns, std::chrono::steady_clock::time_point now);
  void TakeIncoming(Conns& conns);
  void Read(Conns& conns, Conns::iterator it);
  void Claim(Conns& conns, Conns::iterator it, const std::string& token);

  const Options options_;
  const tenant::Resolver resolver_;
  ScopedFd wake_;  // eventfd: stop, CloseLease requests, connections from the acceptor
  ClaimFn claim_;
  CloseFn close_;
  TickFn tick_;
  Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::set<std::string> to_close_ ABSL_GUARDED_BY(mu_);
  std::multimap<std::string, std::string> to_notify_ ABSL_GUARDED_BY(mu_);  // lease -> line
  std::vector<net::Accepted> incoming_ ABSL_GUARDED_BY(mu_);                // from the acceptor
  PodSocketBook pods_;
  std::thread thread_;
  std::unique_ptr<net::Acceptor> acceptor_;  // stopped first (destructor)
};

}  // namespace weightcache::server
