// The peer API's TCP port (--peer_listen; issue 47): accepts the connections itself and relays
// each one's bytes to the gRPC server, which does the mutual TLS but listens on a Unix socket
// in a private directory (gRPC 1.51 cannot take an accepted descriptor with TLS credentials:
// grpc_server_add_channel_from_fd refuses any but insecure ones, and its own TCP listener
// bounds nothing). What this part adds in front of gRPC:
//   - a cap on the connections open at once, in all and per source address: past the
//     address's cap a new connection is closed at accept; past the total, the oldest
//     connection still in its handshake is closed to make room (an established peer is never
//     closed for a newcomer), and the newcomer when none is;
//   - a handshake deadline: a connection is closed unless, within `handshake_timeout`, its
//     client sent a complete TLS application-data record and the server answered with one
//     (the bytes of a completed handshake; what they say stays between the peers: this part
//     never decrypts). Bytes that cannot be TLS records (a first record that is no
//     handshake, an unknown record type, a length past TLS's limit) close it at once;
//   - on EMFILE/ENFILE, accepting backs off 100 ms and resumes once descriptors are back
//     (the control socket's listener does the same). gRPC 1.51's listener stops accepting
//     for good after one EMFILE (measured; later releases retry), so a connection is handed
//     to gRPC only while 8 descriptors are free, one at a time, and until gRPC has read what
//     was passed to it (so accepted it: SIOCOUTQ of the relay's end is 0) the port takes no
//     descriptor (no accept, no hand-over).
// Accepting is the acceptor's (pkg/net/acceptor.h), run inside this port's own loop: the caps
// (in all, per source address, with room made at the total as above), the wait for a
// client's first bytes (an idle connection costs one descriptor and nothing here), EMFILE
// back-off; the handshake deadline, the TLS record check and the hand-over to gRPC are the
// port's.
// gRPC still terminates TLS, so its auth_context holds the client's certificate. It sees each
// connection as a Unix peer with an abstract name of its own ("unix-abstract:1f3a9"); SourceOf
// turns that back into the TCP source for logs.
// gRPC is asked to take a connection (the relay connects to its socket) only once the
// client's first bytes came, and only while the descriptors gRPC's accept needs are free: an
// idle connection costs one descriptor (the TCP socket) and nothing in gRPC; a relayed one
// three (the relay's Unix socket and gRPC's end too) and up to 2 x 32 KiB of buffers while
// bytes are in flight.
// Not a public header.
//
// Thread-safety: SourceOf, counters from any thread; StopAccepting, CloseConnections and the
// destructor from one. One thread of its own accepts and moves the bytes.
// Lifetimes: the gRPC server listening on `backend_path` may go before or after; connections
// whose server end closed are closed.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "pkg/net/acceptor.h"
#include "pkg/server/wire/tls_record_scanner.h"
#include "pkg/util/mutex.h"
#include "pkg/util/scoped_fd.h"

namespace weightcache::server {

class PeerPort {
 public:
  struct Options {
    std::string listen;        // "host:port" (IPv6 as "[addr]:port"); port 0: any free one (port())
    std::string backend_path;  // the Unix socket the gRPC server listens on
    // Connections open at once (a daemon keeps one to each peer it asks): in all, and from
    // one source address (the IP, any port).
    size_t max_connections = 1024;
    size_t max_connections_per_address = 16;
    std::chrono::milliseconds handshake_timeout{10000};
    // A connection that moves no byte either way for this long is ended by the acceptor (its
    // channel connects again when it next asks; a fill's pulls move bytes all along). The
    // port sees TLS records, not calls: quiet is idle here. 0: never.
    std::chrono::milliseconds idle{30 * 60 * 1000};
  };
  // Binds and listens (UNAVAILABLE naming `listen` and why when it cannot), then accepts on
  // its own thread.
  static absl::StatusOr<std::unique_ptr<PeerPort>> Start(Options options);
  ~PeerPort();
  PeerPort(const PeerPort&) = delete;
  PeerPort& operator=(const PeerPort&) = delete;

  int port() const { return port_; }

  // Stops accepting (the listening sockets close); the connections stay. Idempotent.
  void StopAccepting();
  // StopAccepting, and closes every connection. Counters still answer. Idempotent.
  void CloseConnections();

  // The TCP source ("ipv4:10.1.2.3:40512", "ipv6:[fd00::7]:40512") of the relayed connection
  // that gRPC names `grpc_peer` (ServerContext::peer()); `grpc_peer` itself when unknown.
  std::string SourceOf(const std::string& grpc_peer) const;

  struct Counters {
    uint64_t open = 0;      // held now (relayed, or waiting for the client's first bytes)
    uint64_t accepted = 0;  // admitted since start (their first bytes came)
    uint64_t relayed = 0;   // handed to gRPC since start
    // Closed, by reason: at the door (the acceptor's: "total" at accept or made room,
    // "per_key" for the address's cap, "first_byte", "descriptors" when accept(2) failed for
    // want of them), and by the port: "handshake_deadline" (no completed handshake by the
    // deadline), "not_tls" (bytes that cannot be TLS records), "handover" (the relay's socket
    // to gRPC could not be made, or gRPC's socket did not take it).
    std::map<std::string, uint64_t> refused;
  };
  Counters counters() const;
  // False while accepting, or handing connections to gRPC, waits for descriptors.
  bool healthy() const { return acceptor_->healthy() && handover_ok_.load(); }

 private:
  struct Conn;
  PeerPort(Options options, int port, ScopedFd epoll, ScopedFd wake);
  void Loop();
  // StopAccepting's and CloseConnections' requests, the handshake deadlines, the hand-overs:
  // what is due before waiting for events.
  void Tick(std::chrono::steady_clock::time_point now);
  // When the loop must wake at the latest (-1: no timer due).
  int TimeoutMs(std::chrono::steady_clock::time_point now) const;
  void OnEvent(uint64_t data, uint32_t events);
  // Who a connection is (its source address), for the acceptor.
  absl::StatusOr<net::Identity> Identify(int fd) const;
  // Takes a connection the acceptor admitted (its first bytes came).
  void Take(net::Accepted a);
  // At the total cap: closes the oldest connection still in its handshake; false when every
  // one is past it.
  bool MakeRoom();
  // Hands the waiting connections to gRPC while descriptors allow; when to try again.
  std::chrono::steady_clock::time_point ServeWaiting();
  // Connections handed to gRPC that it has not read from yet.
  size_t Unread();
  // Connects the relay to gRPC's socket for `c`; false (logged) when it cannot.
  bool HandOver(Conn& c);
  // Moves what can move without blocking; false when the connection is over.
  bool Pump(Conn& c);
  void Watch(Conn& c);
  void OutOfDescriptors(std::atomic<bool>& ok, const std::string& what, int err);
  // Closes connection `id` (gone from conns_), counting `reason` (null: it ended).
  void Close(uint64_t id, const char* reason);

  const Options options_;
  const int port_;
  ScopedFd epoll_;
  ScopedFd wake_;
  std::unique_ptr<net::Acceptor> acceptor_;  // run by the loop (inline)
  std::atomic<bool> stop_accepting_{false};
  std::atomic<bool> close_all_{false};
  std::atomic<bool> stop_{false};
  std::atomic<bool> handover_ok_{true};
  // The loop thread's.
  std::map<uint64_t, std::unique_ptr<Conn>> conns_;
  // Connections in accept order with their handshake deadlines (in the same order); ids of
  // closed or established connections are skipped when they come up.
  std::deque<std::pair<std::chrono::steady_clock::time_point, uint64_t>> pending_;
  // Connections whose first bytes came, in order, for gRPC to take; and the one handed to it
  // that it has not read from yet (at most one).
  std::deque<uint64_t> waiting_;
  std::vector<uint64_t> unread_;
  bool accepting_ = true;
  std::chrono::steady_clock::time_point serve_waiting_at_ =
      std::chrono::steady_clock::time_point::max();
  uint64_t next_id_ = 1;
  uint64_t silent_server_ = 0;  // connections gRPC never answered (logged)
  mutable Mutex mu_;
  CondVar cv_;
  std::map<std::string, std::string> sources_ ABSL_GUARDED_BY(mu_);  // gRPC's name -> TCP source
  Counters counters_ ABSL_GUARDED_BY(mu_);  // the port's own; the acceptor's are added
  bool accepting_stopped_ ABSL_GUARDED_BY(mu_) = false;
  bool connections_closed_ ABSL_GUARDED_BY(mu_) = false;
  bool loop_ended_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace weightcache::server
