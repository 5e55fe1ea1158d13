// Acceptor: the one door of every listener (control, handle, keeper, peer, metrics, webhook).
// A listener supplies its listening sockets, a function that says who a connection is (its
// key for the caps, or a refusal), its numbers and what to do with a connection once
// admitted; the acceptor does the rest, the same way for all of them:
//   - accepts (non-blocking, close-on-exec), draining each socket's backlog;
//   - asks the listener who the peer is (`identify`): a refusal closes the connection;
//   - applies the caps, per key and in total (KeyedLimiter): past them the connection is
//     closed (after `tell_refused`, if set, told it why); a key may hold a band past its cap
//     whose connections are handed over marked `over_cap`;
//   - holds the connection until its first byte arrives, for at most `first_byte`: a client
//     that connects and says nothing costs a descriptor and its place in the caps until the
//     deadline, never a thread or a buffer of the listener's;
//   - on EMFILE/ENFILE (or when fewer than `fds_per_connection` descriptors are free) stops
//     accepting for 100 ms, reports unhealthy, and resumes once descriptors are back (never
//     spins on a readable socket, never stops for good);
//   - with `idle` set, ends a handed-over connection that moved no byte for that long and has
//     no work in flight (activity.h: the listener touches it as bytes move and marks it busy
//     while work runs): shut down, so the listener's loop sees it end and closes it;
//   - counts each refusal by reason ("identity", "total", "per_key", "first_byte",
//     "descriptors", and "idle" for a connection ended idle) through `on_refused`: the daemon
//     turns it into one metric family, weightcache_connections_refused_total{listener, reason}.
// The admitted connection carries its Slot: the place it holds in the caps is given back when
// the listener drops it, whoever ends the connection.
//
// Thread-safety: Listen, Unlisten, Stop, counters, healthy from any thread. `identify`,
// `serve`, `tell_refused`, `on_refused` and `make_room` run on the acceptor's own thread (or
// the listener's loop thread, own_thread false), one at a time, and must not block (identify
// may read a few small /proc files).
// Lifetimes: Stop (or the destructor) joins the thread; connections already handed over are
// the listener's and are not touched; connections waiting for their first byte are closed.
#pragma once

#include <sys/types.h>

#include <any>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "pkg/net/activity.h"
#include "pkg/net/keyed_limiter.h"
#include "pkg/util/epoll_loop.h"
#include "pkg/util/mutex.h"
#include "pkg/util/scoped_fd.h"

namespace weightcache::net {

// Who a connection is, for the caps and for messages.
struct Identity {
  std::string key;       // the cap's key: equal for connections of one caller
  std::string describe;  // for logs: "pod 1234abcd-…", "10.0.0.3", "uid 0"
  std::any detail;       // the listener's own record of the peer, handed back with it
};

// A connection the acceptor admitted; the listener owns it from then on.
struct Accepted {
  ScopedFd fd;
  Identity who;
  std::string tag;          // the tag of the listening socket it came in on
  bool over_cap = false;    // admitted in its key's band past the cap
  KeyedLimiter::Slot slot;  // its place in the caps: given back when dropped
  std::chrono::steady_clock::time_point accepted;
  // With `idle` set: the listener touches it as bytes move and marks work in flight; keep it
  // beside the descriptor, destroyed before it closes (activity.h). Empty without `idle`.
  ActivityHandle activity;
};

struct ListenerOptions {
  std::string name;  // "control", "handle", …: in logs and the metric's listener label
  KeyedLimiter::Limits limits{.total = 1024, .per_key = 64, .over_cap = 0, .own_caps = {}};
  // 0: a connection is handed over at accept (protocols where the server speaks first).
  std::chrono::milliseconds first_byte{0};
  // 0: connections live as long as the listener keeps them (the handle channel: a connection
  // is its lease's life; the keeper: the daemon's one link). Else a handed-over connection
  // that moved no byte for this long and is not busy is shut down ("idle").
  std::chrono::milliseconds idle{0};
  // Descriptors the listener takes for a connection besides the accepted one (the control
  // socket's relay: 2): accepting waits while they cannot be had.
  int fds_per_connection = 0;
  // Who the peer on `fd` (accepted on the socket tagged `tag`) is; an error refuses it
  // ("identity"), its message logged and, with tell_refused, told.
  std::function<absl::StatusOr<Identity>(int fd, const std::string& tag)> identify;
  // Takes an admitted connection; false: out of descriptors for it (the connection is closed
  // and accepting backs off).
  std::function<bool(Accepted)> serve;
  // Optional: what a refused peer is told before its socket closes (non-blocking sends only).
  std::function<void(int fd, const std::string& reason, const std::string& message)> tell_refused;
  // Optional: counts a refusal ("identity", "total", "per_key", "first_byte", "descriptors").
  std::function<void(const std::string& reason)> on_refused;
  // Optional: at the cap in all, a newcomer is admitted in place of an older connection that
  // is not yet established: the oldest one waiting for its first byte, else the one this
  // closes (the listener's oldest still in its handshake: it closes it and drops its Slot
  // before returning true; false when every one is established). The one closed counts as
  // "total". Unset: at the cap the newcomer is refused.
  std::function<bool()> make_room;
  // True: the acceptor runs on a thread of its own. False: the listener's event loop runs it
  // (fd(), TimeoutMs(), Run()), so `identify`, `serve` and `make_room` run on that loop's
  // thread and may touch its state without locks.
  bool own_thread = true;
};

class Acceptor {
 public:
  static absl::StatusOr<std::unique_ptr<Acceptor>> Start(ListenerOptions options);
  ~Acceptor();
  Acceptor(const Acceptor&) = delete;
  Acceptor& operator=(const Acceptor&) = delete;

  // Accepts on `listening` (made non-blocking here) from now on; its connections carry `tag`.
  absl::Status Listen(ScopedFd listening, std::string tag);
  // Stops accepting on the sockets tagged `tag` (closes them); their connections stay.
  void Unlisten(const std::string& tag);
  // Stops accepting on every socket and joins the thread. Idempotent.
  void Stop();

  // Without a thread of its own (own_thread false), from the listener's loop thread: a
  // descriptor that is readable when Run has work (poll it with the loop's others), the
  // longest the loop may wait before calling Run (-1: until fd() is readable), and Run, which
  // accepts, hands over and expires what is due without blocking.
  int fd() const { return epoll_.get(); }
  int TimeoutMs() const;
  void Run() { Step(0); }

  struct Counters {
    uint64_t accepted = 0;                    // handed to the listener
    std::map<std::string, uint64_t> refused;  // by reason
    uint64_t waiting = 0;                     // held for their first byte now
    uint64_t open = 0;  // places held in the caps now (waiting and handed over)
  };
  Counters counters() const;
  // False while accepting waits for descriptors.
  bool healthy() const { return healthy_.load(); }
  const KeyedLimiter& limiter() const { return limiter_; }
  const std::string& name() const { return options_.name; }

 private:
  struct Waiting;
  struct Watched {
    std::shared_ptr<Activity> activity;
    std::string describe;
  };
  struct Socket {
    ScopedFd fd;
    std::string tag;
    uint64_t id = 0;
  };
  Acceptor(ListenerOptions options, ScopedFd epoll, ScopedFd wake);
  void Loop();
  // One pass: waits at most `timeout_ms` for events, then handles them.
  void Step(int timeout_ms);
  // At the cap in all: closes a connection that is not established for a newcomer.
  bool MakeRoom();
  // Accepts what `s` has pending; false when accepting must back off.
  bool AcceptFrom(const Socket& s);
  void Admit(ScopedFd conn, const std::string& tag);
  void HandOver(Accepted a);
  void Refuse(int fd, const std::string& reason, const std::string& message);
  void SetListening(bool on);
  bool DescriptorsFree() const;
  void SyncSockets();
  void ExpireWaiting();
  // Ends the handed-over connections idle past `idle`; forgets the closed ones.
  void ExpireIdle();

  const ListenerOptions options_;
  KeyedLimiter limiter_;
  ScopedFd epoll_;
  ScopedFd wake_;
  std::atomic<bool> healthy_{true};
  std::atomic<bool> stop_{false};
  std::thread thread_;

  mutable Mutex mu_;
  // Listen and Unlisten calls not yet applied, in their order (a socket unlistened and then
  // listened again under its tag stays).
  struct SocketChange {
    bool add = false;
    Socket socket;  // add: the socket (its tag); remove: the tag in socket.tag
  };
  std::vector<SocketChange> changes_ ABSL_GUARDED_BY(mu_);
  Counters counters_ ABSL_GUARDED_BY(mu_);

  // The loop thread's (the acceptor's own, or the listener's loop).
  EpollWaiter waiter_;
  std::map<uint64_t, Socket> sockets_;                    // by id (epoll data: id << 1)
  std::map<uint64_t, std::unique_ptr<Waiting>> waiting_;  // by id (epoll data: id << 1 | 1)
  uint64_t next_id_ = 1;
  bool listening_on_ = true;
  std::chrono::steady_clock::time_point backoff_until_{};
  std::vector<Watched> watched_;  // handed over, with `idle` set
  std::chrono::steady_clock::time_point next_idle_scan_{};
};

}  // namespace weightcache::net
