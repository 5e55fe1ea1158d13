#include "pkg/server/wire/connection_table.h"

namespace weightcache::server {

void ConnectionTable::Insert(int fd, uint64_t ino, Caller caller) {
  conns_[fd] = Conn{std::move(caller), ino};
}

std::optional<Caller> ConnectionTable::Find(int fd, uint64_t ino) const {
  auto it = conns_.find(fd);
  if (it == conns_.end() || ino == 0 || it->second.ino != ino) return std::nullopt;
  return it->second.caller;
}

size_t ConnectionTable::Reap(const std::function<uint64_t(int fd)>& inode_of) {
  size_t gone = 0;
  for (auto it = conns_.begin(); it != conns_.end();) {
    if (inode_of(it->first) != it->second.ino) {
      it = conns_.erase(it);
      ++gone;
    } else {
      ++it;
    }
  }
  return gone;
}

}  // namespace weightcache::server
