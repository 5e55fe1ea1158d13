// weightcache-keeper's core: holds, per deposited cache entry, one copy of every segment
// descriptor and the daemon's opaque record, so that the memory (host memfds, CUDA VMM
// allocations: the kernel and the driver count descriptor references) outlives a daemon
// crash or upgrade, and a restarted daemon adopts it instead of reading the disk.
//
// It never interprets the record and never loads CUDA (tests check its link line and its
// mappings): it is a few hundred lines that rarely change, so its DaemonSet rarely rolls.
//
// Protocol (wire.h): the keeper greets each accepted peer (kOk{kGreeting}), then serves one
// request at a time:
//   kDeposit{key, body, nfds} -> kProceed, then nfds descriptors -> kOk    (replaces key)
//                             -> kError RESOURCE_EXHAUSTED at the descriptor limit
//                                (nothing crosses; the daemon keeps serving the entry)
//   kDrop{key}                -> kOk | kError NOT_FOUND
//   kAdopt                    -> kEntry{key, body, nfds} + descriptors, ..., kEnd{count}
//   kStats                    -> kOk{"entries=N fds=N max_fds=N"}
// Peers: SO_PEERCRED uid must be allowed (default: the keeper's own uid, i.e. the daemon
// runs as the same user); others get kError PERMISSION_DENIED and are disconnected.
// One owner at a time: the first connection that deposits, drops or adopts owns the keeper
// until it closes; another connection's deposit, drop or adopt is answered kError
// FAILED_PRECONDITION naming the owner's pid (a second daemon, started for debugging with
// the default keeper socket, can neither take nor drop the first one's entries). kStats is
// answered to any allowed peer.
//
// Connections come through the acceptor (pkg/net/acceptor.h): the uid check, the cap on
// connections (`max_connections`, past it kError RESOURCE_EXHAUSTED), EMFILE back-off.
// Thread-safety: Start/Stop/stats from any thread; the acceptor's thread admits, one thread per
// connection serves. Lifetimes: the descriptors live until dropped, replaced, or the Keeper goes.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "pkg/keeper/wire.h"
#include "pkg/net/acceptor.h"
#include "pkg/util/mutex.h"
#include "pkg/util/scoped_fd.h"

namespace weightcache::keeper {

inline constexpr const char* kDefaultSocket = "/run/weightcache-keeper/keeper.sock";

struct KeeperOptions {
  std::string socket_path = kDefaultSocket;  // a missing directory is created 0700
  std::vector<uid_t> allowed_uids;           // empty: the keeper's own uid
  // Descriptors it may hold for entries; 0: the open-file limit (raised to the hard limit
  // at start) less kReservedFds for its sockets.
  uint64_t max_fds = 0;
  size_t max_connections = 16;
};

inline constexpr uint64_t kReservedFds = 64;

class Keeper {
 public:
  static absl::StatusOr<std::unique_ptr<Keeper>> Start(KeeperOptions options);
  ~Keeper();
  Keeper(const Keeper&) = delete;
  Keeper& operator=(const Keeper&) = delete;

  struct Stats {
    size_t entries = 0;
    uint64_t fds = 0;
    uint64_t max_fds = 0;
  };
  Stats stats() const;
  const std::string& path() const { return options_.socket_path; }
  // Stops accepting, disconnects peers, joins; descriptors are closed when the Keeper goes.
  void Stop();

 private:
  struct Held {
    std::string body;
    std::vector<ScopedFd> fds;
  };

  explicit Keeper(KeeperOptions options);
  // Who a peer is: its uid, when allowed (the acceptor refuses the others).
  absl::StatusOr<net::Identity> Identify(int fd) const;
  // Greets an admitted peer and starts its thread.
  void Admit(net::Accepted c);
  void Serve(int fd);
  // One request; false ends the connection.
  absl::Status Handle(int fd, Message m);
  absl::Status Deposit(int fd, Message m);
  absl::Status Adopt(int fd);
  // OK when `fd` owns the keeper (taking it when nobody does); the refusal to send otherwise.
  absl::Status Claim(int fd);

  KeeperOptions options_;
  std::unique_ptr<net::Acceptor> acceptor_;  // caps, the uid check, EMFILE back-off

  mutable Mutex mu_;
  std::map<std::string, std::shared_ptr<const Held>> entries_ ABSL_GUARDED_BY(mu_);
  uint64_t fds_ ABSL_GUARDED_BY(mu_) = 0;  // held, plus reserved by deposits in flight
  std::map<int, std::thread> connections_ ABSL_GUARDED_BY(mu_);
  std::vector<int> finished_ ABSL_GUARDED_BY(mu_);
  int owner_fd_ ABSL_GUARDED_BY(mu_) = -1;  // the owning connection; -1: none
  pid_t owner_pid_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace weightcache::keeper
