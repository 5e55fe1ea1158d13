// The control listener's book of open connections: who holds each one, how many each tenant
// unit (pod, slot or process: pkg/tenant/unit.h) holds, and which new connection is served, told it
// is over its unit's cap, or closed at accept. Pure bookkeeping (no sockets, no threads), so its
// rules are unit-tested directly.
//
// A connection is keyed by the descriptor gRPC holds for it and that socket's inode, read
// before gRPC got the descriptor. gRPC closes connections without telling; the kernel then
// reuses the number. So an entry is only the caller's while the number still names the same
// inode (Find), a number taken again replaces the old entry and releases its unit's count
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
#include <string>

#include "pkg/server/wire/caller.h"

namespace weightcache::server {

class ConnectionTable {
 public:
  struct Limits {
    size_t max_connections = 2048;         // all units: past it, closed at accept
    size_t max_connections_per_pod = 256;  // per unit; past it: only RESOURCE_EXHAUSTED answers
    // The cap of the one unit every unresolved peer shares (tenant::kUnresolvedKey: gone, a
    // zombie or not visible at accept), in place of max_connections_per_pod.
    size_t max_connections_unresolved = 16;
    // Over-cap connections one unit may hold at once so that it learns why it is refused;
    // past them, closed at accept (otherwise one unit could fill the whole table). Issue 47:
    // per uid, one pod's 300 idle connections left every other root pod with none.
    size_t over_cap_held = 4;
  };
  enum class Admission {
    kServe,         // within every cap
    kServeOverCap,  // past the unit's cap: kept, every request answered RESOURCE_EXHAUSTED
    kCloseTotal,    // the table is full
    kCloseUnitCap,  // the unit holds its cap and its over-cap connections already
  };

  explicit ConnectionTable(Limits limits) : limits_(limits) {}

  // What to do with a new connection of the unit keyed `unit` (tenant::Unit::Key), given the
  // table now (Reap first).
  Admission Admit(const std::string& unit) const;
  // Records a connection now held under descriptor `fd` with socket inode `ino`. An entry
  // already under `fd` is a closed connection whose number the kernel reused: it is dropped
  // and its unit's count released.
  void Insert(int fd, uint64_t ino, Caller caller);
  // The caller of the connection under `fd` if that number still names socket inode `ino`.
  std::optional<Caller> Find(int fd, uint64_t ino) const;
  // Drops every entry whose descriptor no longer names its inode (`inode_of` returns 0 for a
  // closed descriptor). Returns how many went.
  size_t Reap(const std::function<uint64_t(int fd)>& inode_of);

  // Every connection closed at once.
  void Clear() {
    conns_.clear();
    per_unit_.clear();
  }

  size_t size() const { return conns_.size(); }
  size_t OfUnit(const std::string& unit) const;
  // The cap of the unit keyed `unit`: max_connections_unresolved for the unresolved one.
  size_t CapOf(const std::string& unit) const;

 private:
  struct Conn {
    Caller caller;
    uint64_t ino = 0;
  };
  void Release(const Conn& c);

  const Limits limits_;
  std::map<int, Conn> conns_;
  std::map<std::string, size_t> per_unit_;
};

}  // namespace weightcache::server
