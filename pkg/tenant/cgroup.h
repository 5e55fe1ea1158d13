// Which Kubernetes pod a process belongs to, read from its cgroup path (/proc/PID/cgroup).
// The kubelet puts every container of a pod under one cgroup per pod, named by the pod's
// UID; the path's shape depends on the cgroup driver, the runtime and the QoS class:
//
//   cgroupfs driver (v1 and v2):
//     /kubepods/pod<UID>/<container>                        Guaranteed
//     /kubepods/burstable/pod<UID>/<container>              Burstable
//     /kubepods/besteffort/pod<UID>/<container>             BestEffort
//     <container>: containerd and docker the bare 64-hex id; CRI-O "crio-<id>"
//   systemd driver (v1 and v2), the UID's dashes written as underscores:
//     /kubepods.slice/kubepods-pod<UID_>.slice/<scope>
//     /kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<UID_>.slice/<scope>
//     /kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod<UID_>.slice/<scope>
//     <scope>: containerd "cri-containerd-<id>.scope", CRI-O "crio-<id>.scope" (its monitor
//     "crio-conmon-<id>.scope"), docker (cri-dockerd) "docker-<id>.scope"
//   Prefixes before the kubepods part: a --cgroup-root (kind: /kubelet.slice/kubelet-kubepods
//   .slice/kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-pod<UID_>.slice/...),
//   or "/../.." when the reader runs in a cgroup namespace of its own (the daemon's container
//   on cgroup v2 sees other pods' paths relative to its own root).
//   The UID is a UUID (8-4-4-4-12 hex) for API pods and 32 hex digits for static pods (the
//   kubelet's hash of the manifest).
//
// A cgroup v1 host lists one line per hierarchy ("ID:controllers:path"), v2 one line
// ("0::path"), a hybrid host both. Every line that names a pod must name the same pod: lines
// that disagree (a process moved between pods in one hierarchy only) name no pod.
//
// Thread-safety: pure functions.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace weightcache::tenant {

struct CgroupLine {
  std::string hierarchy;    // "0" on v2
  std::string controllers;  // "" on v2; "memory", "cpu,cpuacct", "name=systemd" on v1
  std::string path;
};

// The lines of a /proc/PID/cgroup file. INVALID_ARGUMENT naming the line that is not
// "ID:controllers:path".
absl::StatusOr<std::vector<CgroupLine>> ParseProcCgroup(absl::string_view content);

struct PodRef {
  std::string uid;        // lower case, with dashes for a UUID
  std::string container;  // the container id, when the path names one ("" otherwise)
  std::string driver;     // "cgroupfs" | "systemd": which layout matched, for messages
};

// The pod that one cgroup path names, if any.
std::optional<PodRef> PodOfPath(absl::string_view path);

// The pod of a process from its /proc/PID/cgroup lines: the one pod every line that names one
// agrees on; nullopt when no line names a pod, or when lines disagree.
std::optional<PodRef> PodOfLines(const std::vector<CgroupLine>& lines);

}  // namespace weightcache::tenant
