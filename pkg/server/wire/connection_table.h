// The control listener's book of open connections: who holds each one. Pure bookkeeping (no
// sockets, no threads), so its rules are unit-tested directly; the caps are the acceptor's
// (pkg/net), whose places the relay holds while a connection lives.
//
// A connection is keyed by the descriptor gRPC holds for it and that socket's inode, read
// before gRPC got the descriptor. gRPC closes connections without telling; the kernel then
// reuses the number. So an entry is only the caller's while the number still names the same
// inode (Find), a number taken again replaces the old entry (Insert), and Reap drops every
// entry whose inode is gone.
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
  // Records a connection now held under descriptor `fd` with socket inode `ino`. An entry
  // already under `fd` is a closed connection whose number the kernel reused: replaced.
  void Insert(int fd, uint64_t ino, Caller caller);
  // The caller of the connection under `fd` if that number still names socket inode `ino`.
  std::optional<Caller> Find(int fd, uint64_t ino) const;
  // Drops every entry whose descriptor no longer names its inode (`inode_of` returns 0 for a
  // closed descriptor). Returns how many went.
  size_t Reap(const std::function<uint64_t(int fd)>& inode_of);
  // Every connection closed at once.
  void Clear() { conns_.clear(); }
  size_t size() const { return conns_.size(); }

 private:
  struct Conn {
    Caller caller;
    uint64_t ino = 0;
  };
  std::map<int, Conn> conns_;
};

}  // namespace weightcache::server
