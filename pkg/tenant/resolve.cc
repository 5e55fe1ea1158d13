#include "pkg/tenant/resolve.h"

#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "pkg/tenant/cgroup.h"
#include "pkg/util/log.h"
#include "pkg/util/scoped_fd.h"

namespace weightcache::tenant {
namespace {

std::string ReadSmallFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return {};
  std::ostringstream s;
  s << in.rdbuf();
  std::string out = s.str();
  if (out.size() > (64 << 10)) out.resize(64 << 10);
  return out;
}

#ifndef SO_PEERPIDFD
#define SO_PEERPIDFD 77  // Linux 6.5; older headers lack it
#endif

// What SO_PEERPIDFD says of the peer of `sock`.
struct Pinned {
  ScopedFd pidfd;     // valid: the peer's process, pinned
  bool gone = false;  // the kernel has the option and the peer's process is gone already
};

Pinned PinPeer(int sock) {
  Pinned p;
  if (sock < 0) return p;
  int fd = -1;
  socklen_t len = sizeof fd;
  if (::getsockopt(sock, SOL_SOCKET, SO_PEERPIDFD, &fd, &len) == 0 && fd >= 0) {
    p.pidfd.reset(fd);
  } else if (errno != ENOPROTOOPT && errno != EOPNOTSUPP) {
    p.gone = true;  // ESRCH / EINVAL: no process left to pin
  }
  return p;
}

// Whether the process `pidfd` pins has exited (a zombie included): its pidfd polls readable.
bool Exited(int pidfd) {
  pollfd p{pidfd, POLLIN, 0};
  return ::poll(&p, 1, 0) != 0;
}

}  // namespace

char StateOfStat(const std::string& stat) {
  const size_t close = stat.rfind(')');
  if (close == std::string::npos || close + 2 >= stat.size()) return '\0';
  return stat[close + 2];
}

uint64_t StartTicksOfStat(const std::string& stat) {
  const size_t close = stat.rfind(')');
  if (close == std::string::npos) return 0;
  // After ") ": field 3 (state) is the first; starttime is field 22, the 20th from there.
  const std::vector<absl::string_view> f =
      absl::StrSplit(absl::string_view(stat).substr(close + 1), ' ', absl::SkipEmpty());
  if (f.size() < 20) return 0;
  return std::strtoull(std::string(f[19]).c_str(), nullptr, 10);
}

Unit Resolver::Resolve(pid_t pid, int sock) const {
  Unit u;
  u.pid = pid;
  const Pinned pinned = PinPeer(sock);
  if (pinned.gone) {
    unknown_++;
    return u;
  }
  if (pid <= 0) {
    unknown_++;
    if (!warned_.exchange(true)) {
      WC_LOG_WARN(
          "a peer's pid is not visible in this pid namespace (SO_PEERCRED reports 0): peers "
          "that are not told apart by pod share one unresolved tenant unit and its small cap "
          "(--max_connections_unresolved); run the daemon with hostPID (the chart's "
          "daemon.hostPID), or give each pod its slot socket, so leases and caps are per pod");
    }
    return u;
  }
  const std::string dir = absl::StrCat(proc_root_, "/", pid);
  const std::string stat = ReadSmallFile(dir + "/stat");
  u.start_ticks = StartTicksOfStat(stat);
  auto lines = ParseProcCgroup(ReadSmallFile(dir + "/cgroup"));
  // Gone before it was read, a zombie (its pid is about to name nobody, then anybody), or
  // exited while it was read (with a pidfd: then what was read may be another's): nothing
  // says who it was.
  const char state = StateOfStat(stat);
  if (u.start_ticks == 0 || state == 'Z' || state == 'X' ||
      (pinned.pidfd && Exited(pinned.pidfd.get()))) {
    u.start_ticks = 0;
    unknown_++;
    return u;
  }
  if (lines.ok()) {
    if (std::optional<PodRef> pod = PodOfLines(*lines)) {
      u.kind = UnitKind::kPod;
      u.pod = pod->uid;
      u.container = pod->container;
      pods_++;
      return u;
    }
  }
  u.kind = UnitKind::kProcess;
  processes_++;
  return u;
}

Resolver::Counts Resolver::counts() const { return {pods_, processes_, unknown_}; }

}  // namespace weightcache::tenant
