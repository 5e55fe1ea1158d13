// The pods' own sockets one listener serves (pod_volumes.h): by pod UID, the socket's path and
// the unit the kubelet named for it. The control listener and the handle channel each keep
// one; a connection on the socket tagged "pod:<uid>" is that pod's (UnitOf).
//
// Thread-safety: every method from any thread. Lifetimes: the acceptor outlives the book.
#pragma once

#include <map>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "pkg/net/acceptor.h"
#include "pkg/tenant/unit.h"
#include "pkg/util/mutex.h"

namespace weightcache::server {

class PodSocketBook {
 public:
  static constexpr char kTagPrefix[] = "pod:";
  static bool IsPodTag(const std::string& tag) { return tag.rfind(kTagPrefix, 0) == 0; }

  // Listens at `path` (0666: the directory is the pod's alone) through `acceptor` under tag
  // "pod:<uid>", replacing the pod's earlier socket.
  absl::Status Add(net::Acceptor& acceptor, const std::string& path, const tenant::Unit& pod,
                   int backlog);
  // Stops accepting on pod `uid`'s socket and removes it; its connections stay.
  void Remove(net::Acceptor& acceptor, const std::string& uid);
  // The unit of a connection on the socket tagged `tag`, its pid `pid`; nullopt when the
  // socket was removed meanwhile.
  std::optional<tenant::Unit> UnitOf(const std::string& tag, pid_t pid) const;
  // Removes every socket file (the listener stops).
  void UnlinkAll();

 private:
  struct Entry {
    std::string path;
    tenant::Unit unit;
  };
  mutable Mutex mu_;
  std::map<std::string, Entry> pods_ ABSL_GUARDED_BY(mu_);  // by pod UID
};

}  // namespace weightcache::server
