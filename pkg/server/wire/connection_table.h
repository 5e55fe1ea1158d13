// The control listener's book of open connections: who holds each one, how many each uid
// holds, and which new connection is served, told it is over its uid's cap, or closed at
// accept. Pure bookkeeping (no sockets, no threads), so its rules are unit-tested directly.
//
// A connection is keyed by the descriptor gRPC holds for it and that socket's inode, read
// before gRPC got the descriptor. gRPC closes connections without telling; the kernel then
// reuses the number. So an entry is only the caller's while the number still names the same
// inode (Find), a number taken again replaces the old entry and releases its uid's count
// (Insert), and Reap drops every entry whose inode is gone.
//
// Not a public header. Thread-safety: none; the listener guards it with its mutex.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>

#include "pkg/server/wire/caller.h"

namespace weightcache::server {

class ConnectionTable {
 public:
  struct Limits {
    size_t max_connections = 2048;         // all uids: past it, closed at accept
    size_t max_connections_per_uid = 256;  // past it: served only RESOURCE_EXHAUSTED answers
    // Over-cap connections one uid may hold at once so that it learns why it is refused;
    // past them, closed at accept (otherwise one uid could fill the whole table).
    size_t over_cap_held = 4;
  };
  enum class Admission {
    kServe,         // within every cap
    kServeOverCap,  // past the uid's cap: kept, every request answered RESOURCE_EXHAUSTED
    kCloseTotal,    // the table is full
    kCloseUidCap,   // the uid holds its cap and its over-cap connections already
  };

  explicit ConnectionTable(Limits limits) : limits_(limits) {}

  // What to do with a new connection of `uid`, given the table now (Reap first).
  Admission Admit(uid_t uid) const;
  // Records a connection now held under descriptor `fd` with socket inode `ino`. An entry
  // already under `fd` is a closed connection whose number the kernel reused: it is dropped
  // and its uid's count released.
  void Insert(int fd, uint64_t ino, Caller caller);
  // The caller of the connection under `fd` if that number still names socket inode `ino`.
  std::optional<Caller> Find(int fd, uint64_t ino) const;
  // Drops every entry whose descriptor no longer names its inode (`inode_of` returns 0 for a
  // closed descriptor). Returns how many went.
  size_t Reap(const std::function<uint64_t(int fd)>& inode_of);

  // Every connection closed at once.
  void Clear() {
    conns_.clear();
    per_uid_.clear();
  }

  size_t size() const { return conns_.size(); }
  size_t OfUid(uid_t uid) const;

 private:
  struct Conn {
    Caller caller;
    uint64_t ino = 0;
  };
  void Release(const Conn& c);

  const Limits limits_;
  std::map<int, Conn> conns_;
  std::map<uid_t, size_t> per_uid_;
};

}  // namespace weightcache::server
