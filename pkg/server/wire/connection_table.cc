#include "pkg/server/wire/connection_table.h"

namespace weightcache::server {

ConnectionTable::Admission ConnectionTable::Admit(const std::string& unit) const {
  if (conns_.size() >= limits_.max_connections) return Admission::kCloseTotal;
  const size_t mine = OfUnit(unit);
  const size_t cap = CapOf(unit);
  if (mine < cap) return Admission::kServe;
  if (mine < cap + limits_.over_cap_held) {
    return Admission::kServeOverCap;
  }
  return Admission::kCloseUnitCap;
}

void ConnectionTable::Insert(int fd, uint64_t ino, Caller caller) {
  auto it = conns_.find(fd);
  if (it != conns_.end()) {
    Release(it->second);
    conns_.erase(it);
  }
  ++per_unit_[caller.unit.Key()];
  conns_[fd] = Conn{std::move(caller), ino};
}

std::optional<Caller> ConnectionTable::Find(int fd, uint64_t ino) const {
  auto it = conns_.find(fd);
  if (it == conns_.end() || ino == 0 || it->second.ino != ino) return std::nullopt;
  Caller c = it->second.caller;
  c.unit_connections = OfUnit(c.unit.Key());
  c.unit_cap = CapOf(c.unit.Key());
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

size_t ConnectionTable::CapOf(const std::string& unit) const {
  return unit == tenant::kUnresolvedKey ? limits_.max_connections_unresolved
                                        : limits_.max_connections_per_pod;
}

size_t ConnectionTable::OfUnit(const std::string& unit) const {
  auto it = per_unit_.find(unit);
  return it == per_unit_.end() ? 0 : it->second;
}

void ConnectionTable::Release(const Conn& c) {
  auto u = per_unit_.find(c.caller.unit.Key());
  if (u != per_unit_.end() && --u->second == 0) per_unit_.erase(u);
}

}  // namespace weightcache::server
