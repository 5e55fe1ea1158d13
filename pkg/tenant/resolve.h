// Resolves a connecting process (its pid from SO_PEERCRED) to its tenant unit: the pod its
// cgroup path names (cgroup.h), else the process itself (pid and start time). Reads
// <proc_root>/PID/cgroup and <proc_root>/PID/stat, so tests can point it at a fixture tree.
//
// The pid must be visible in the daemon's pid namespace: in Kubernetes the daemon runs with
// hostPID (the chart's default); otherwise SO_PEERCRED reports pid 0 for processes of other
// pods and they resolve to the one unresolved unit (the first such peer is logged with the
// fix). So does a peer that is gone or a zombie when /proc is read (a process whose
// children connect and exit at once): what its pid names then is nobody, or somebody else.
//
// Given the connection (`sock`), the process is pinned with SO_PEERPIDFD (Linux 6.5+): /proc
// is read through its pid, and the pidfd then says whether that process is still running;
// only then is what was read its own (a pid is reused only once its process is reaped).
// Where the kernel lacks SO_PEERPIDFD (ENOPROTOOPT) the pid is read as it is: a process that
// exits and whose pid is taken by another before the daemon reads /proc names the new
// process (the window is a few system calls; the start time read at the same moment is what
// tells the two apart afterwards).
//
// Thread-safety: Resolve may be called from any thread. Lifetimes: none.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <string>

#include "pkg/tenant/unit.h"

namespace weightcache::tenant {

class Resolver {
 public:
  explicit Resolver(std::string proc_root = "/proc") : proc_root_(std::move(proc_root)) {}

  // The unit of process `pid` (0: not visible -> kUnknown), the peer of connection `sock`
  // when it is given (>= 0): then that process is pinned with SO_PEERPIDFD where the kernel
  // has it.
  Unit Resolve(pid_t pid, int sock = -1) const;

  // Peers resolved so far by kind, for the log line and tests.
  struct Counts {
    uint64_t pods = 0, processes = 0, unknown = 0;
  };
  Counts counts() const;

 private:
  const std::string proc_root_;
  mutable std::atomic<uint64_t> pods_{0}, processes_{0}, unknown_{0};
  mutable std::atomic<bool> warned_{false};
};

// Field 22 of a /proc/PID/stat line (starttime, clock ticks after boot); 0 when the line is
// not one. The command name (field 2) may hold spaces and parentheses: fields are counted
// after its last ')'.
uint64_t StartTicksOfStat(const std::string& stat);
// Field 3 of a /proc/PID/stat line (the state: R, S, D, Z, X...); '\0' when not one.
char StateOfStat(const std::string& stat);

}  // namespace weightcache::tenant
