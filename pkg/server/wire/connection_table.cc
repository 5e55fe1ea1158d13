#include "pkg/server/wire/connection_table.h"

namespace weightcache::server {

ConnectionTable::Admission ConnectionTable::Admit(uid_t uid) const {
  if (conns_.size() >= limits_.max_connections) return Admission::kCloseTotal;
  const size_t mine = OfUid(uid);
  if (mine < limits_.max_connections_per_uid) return Admission::kServe;
  if (mine < limits_.max_connections_per_uid + limits_.over_cap_held) {
    return Admission::kServeOverCap;
  }
  return Admission::kCloseUidCap;
}

void ConnectionTable::Insert(int fd, uint64_t ino, Caller caller) {
  auto it = conns_.find(fd);
  if (it != conns_.end()) {
    Release(it->second);
    conns_.erase(it);
  }
  ++per_uid_[caller.cred.uid];
  conns_[fd] = Conn{std::move(caller), ino};
}

std::optional<Caller> ConnectionTable::Find(int fd, uint64_t ino) const {
  auto it = conns_.find(fd);
  if (it == conns_.end() || ino == 0 || it->second.ino != ino) return std::nullopt;
  Caller c = it->second.caller;
  c.uid_connections = OfUid(c.cred.uid);
  return c;
}

size_t ConnectionTable::Reap(const std::function<uint64_t(int fd)>& inode_of) {
  size_t gone = 0;
  for (auto it = conns_.begin(); it != conns_.end();) {
    if (inode_of(it->first) != it->second.ino) {
      Release(it->second);
      it = conns_.erase(it);
      ++gone;
    } else {
      ++it;
    }
  }
  return gone;
}

size_t ConnectionTable::OfUid(uid_t uid) const {
  auto it = per_uid_.find(uid);
  return it == per_uid_.end() ? 0 : it->second;
}

void ConnectionTable::Release(const Conn& c) {
  auto u = per_uid_.find(c.caller.cred.uid);
  if (u != per_uid_.end() && --u->second == 0) per_uid_.erase(u);
}

}  // namespace weightcache::server
