// The daemon's side of the keeper protocol (server.h): one connection, one request at a
// time, bounded by a timeout so a hung keeper never holds its caller longer than that.
// Thread-safety: none; one thread uses a client (the daemon's KeeperLink: its worker).
// Lifetimes: descriptors passed to Deposit stay the caller's (the kernel dups them); those
// Adopt returns are the caller's.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "pkg/util/scoped_fd.h"

namespace weightcache::keeper {

class KeeperClient {
 public:
  // UNAVAILABLE (naming the path) when no keeper listens there or its backlog is full;
  // every later request (the greeting included) waits at most `timeout` per message.
  // Who serves the socket is checked first (its SO_PEERCRED uid, before anything is sent
  // or believed): it must be `keeper_uid`, by default this process's own euid. Another uid
  // is PERMISSION_DENIED naming the uid found and the uid expected: whoever bound the path
  // first (a world-writable directory lets anyone) would otherwise be handed every
  // segment descriptor the daemon deposits, and choose what it adopts.
  static absl::StatusOr<std::unique_ptr<KeeperClient>> Connect(
      const std::string& path, std::chrono::milliseconds timeout = std::chrono::seconds(30),
      std::optional<uid_t> keeper_uid = std::nullopt);

  // Keeps `fds` and `body` under `key` (replacing an earlier deposit of it).
  // RESOURCE_EXHAUSTED when the keeper is at its descriptor limit (nothing was sent).
  absl::Status Deposit(const std::string& key, const std::string& body,
                       const std::vector<int>& fds);
  // NOT_FOUND when the keeper holds no such key.
  absl::Status Drop(const std::string& key);
  struct Entry {
    std::string key;
    std::string body;
    std::vector<ScopedFd> fds;
  };
  // Every entry the keeper holds, with a copy of its descriptors (the keeper keeps its own).
  absl::StatusOr<std::vector<Entry>> Adopt();
  // "entries=N fds=N max_fds=N"
  absl::StatusOr<std::string> Stats();

  // The uid that served the socket, when `s` is Connect's refusal of an impostor.
  static std::optional<uid_t> ImpostorUid(const absl::Status& s);

  // The socket, to poll for the keeper's hang-up (POLLRDHUP) while idle, or to shut down
  // from another thread to end a request in flight.
  int fd() const { return sock_.get(); }

 private:
  explicit KeeperClient(ScopedFd sock) : sock_(std::move(sock)) {}
  ScopedFd sock_;
};

}  // namespace weightcache::keeper
