// The tenant unit: who a connection belongs to for leases, connection caps, puts in flight
// and what Status shows (issue 47: every engine pod runs as root, so a uid names nobody).
// Resolved once at accept from the peer's pid (SO_PEERCRED): the pod when its cgroup path
// names one (cgroup.h), the device-plugin slot on a slot socket (one pod each), else the
// process itself (pid and start time, so a reused pid is another unit). A peer that cannot
// be told (its pid not visible, gone or a zombie by the time it is read) is the one shared
// unresolved unit, whatever its pid: never a unit per connection, which would let a pod
// whose children connect and exit at once pass every per-unit cap (the listeners give that
// unit a cap of its own, smaller than a pod's). Uids stay for file permissions and the role
// flags (policy.h). Depends on nothing of the daemon.
//
// Thread-safety: a plain value, copied freely.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>

namespace weightcache::tenant {

// The key every unresolved peer shares (Unit::Key of kUnknown).
inline constexpr char kUnresolvedKey[] = "unknown";

enum class UnitKind {
  kUnknown,  // not resolved (a test's hand-made caller, a peer whose pid is not visible, or
             // one gone or a zombie before it was read): one unit for all of them
  kPod,      // a Kubernetes pod, from the cgroup path: `pod` is its UID
  kSlot,     // a device-plugin slot socket (namespace rules): `slot` is its id
  kProcess,  // outside Kubernetes: one process, `pid` started at `start_ticks`
};

struct Unit {
  UnitKind kind = UnitKind::kUnknown;
  std::string pod;           // kPod: the pod UID (dashes, lower case)
  std::string slot;          // kSlot: the slot id
  pid_t pid = 0;             // the connecting process (0: unknown)
  uint64_t start_ticks = 0;  // its start time (/proc/PID/stat field 22), with pid its identity
  std::string container;     // kPod: the container id from the cgroup path, for messages
  // kPod, when the kubelet named the pod (its CSI volume's socket): where it runs and as whom.
  // Empty when the pod was read from a cgroup path (which names only the UID).
  std::string pod_namespace;
  std::string pod_name;
  std::string service_account;

  // A key that is equal for connections of the same unit and differs otherwise:
  // "pod:<uid>", "slot:<id>", "process:<pid>/<start>", and kUnresolvedKey for every
  // unresolved peer (its pid says nothing: gone, reused or not visible).
  std::string Key() const;
  // For messages: "pod 1234abcd-...", "pod team-a/engine-0" (named by the kubelet),
  // "slot weightcache-3", "process 812",
  // "an unresolved peer (pid 812)".
  std::string Describe() const;
  bool unresolved() const { return kind == UnitKind::kUnknown; }

  // The unit of a connection on a pod's own socket (its CSI volume): the pod the kubelet named,
  // whatever the connecting process (its pid is for messages only).
  static Unit OfNamedPod(std::string uid, std::string ns, std::string name, std::string sa,
                         pid_t pid) {
    Unit u;
    u.kind = UnitKind::kPod;
    u.pod = std::move(uid);
    u.pod_namespace = std::move(ns);
    u.pod_name = std::move(name);
    u.service_account = std::move(sa);
    u.pid = pid;
    return u;
  }
  // The unit of a connection on a device-plugin slot socket (one pod each).
  static Unit OfSlot(std::string slot, pid_t pid) {
    Unit u;
    u.kind = UnitKind::kSlot;
    u.slot = std::move(slot);
    u.pid = pid;
    return u;
  }

  friend bool operator==(const Unit& a, const Unit& b) { return a.Key() == b.Key(); }
};

}  // namespace weightcache::tenant
