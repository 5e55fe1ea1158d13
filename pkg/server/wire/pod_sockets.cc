#include "pkg/server/wire/pod_sockets.h"

#include <unistd.h>

#include "pkg/util/unix_socket.h"

namespace weightcache::server {

absl::Status PodSocketBook::Add(net::Acceptor& acceptor, const std::string& path,
                                const tenant::Unit& pod, int backlog) {
  if (pod.kind != tenant::UnitKind::kPod || pod.pod.empty()) {
    return absl::InvalidArgumentError("a pod socket needs the pod's UID");
  }
  Remove(acceptor, pod.pod);
  // A daemon that was killed left its socket: replaced when nobody listens on it.
  if (absl::Status s = RemoveStaleSocket(path, {.label = "", .server = "daemon"}); !s.ok()) {
    return s;
  }
  auto fd = ListenUnix(path, 0666, backlog);
  if (!fd.ok()) return fd.status();
  {
    MutexLock l(mu_);
    pods_[pod.pod] = Entry{path, pod};
  }
  return acceptor.Listen(std::move(fd).value(), kTagPrefix + pod.pod);
}

void PodSocketBook::Remove(net::Acceptor& acceptor, const std::string& uid) {
  std::string path;
  {
    MutexLock l(mu_);
    auto it = pods_.find(uid);
    if (it == pods_.end()) return;
    path = it->second.path;
    pods_.erase(it);
  }
  acceptor.Unlisten(kTagPrefix + uid);
  ::unlink(path.c_str());
}

std::optional<tenant::Unit> PodSocketBook::UnitOf(const std::string& tag, pid_t pid) const {
  if (!IsPodTag(tag)) return std::nullopt;
  MutexLock l(mu_);
  auto it = pods_.find(tag.substr(sizeof kTagPrefix - 1));
  if (it == pods_.end()) return std::nullopt;
  tenant::Unit u = it->second.unit;
  u.pid = pid;
  return u;
}

void PodSocketBook::UnlinkAll() {
  MutexLock l(mu_);
  for (const auto& [uid, e] : pods_) ::unlink(e.path.c_str());
}

}  // namespace weightcache::server
