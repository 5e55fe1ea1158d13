// A real cgroup laid out as the kubelet's cgroupfs driver lays out a pod's container
// (<mount>/kubepods/besteffort/pod<UID>/<container id>), for tests that need processes the
// daemon resolves to a pod (pkg/tenant). Made in the first writable hierarchy: cgroup v2
// (unified), else cgroup v1's pids. Needs root and a writable cgroupfs; Make() says why not
// when the machine does not allow it, so the test can skip naming the reason.
// Removed (with the processes moved back to the caller's own cgroup) on destruction.
#pragma once

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

namespace weightcache::testing {

class PodCgroup {
 public:
  // `pod_uid`: a UUID; `container`: 64 hex digits. nullptr and `why` when not possible.
  static std::unique_ptr<PodCgroup> Make(const std::string& pod_uid, const std::string& container,
                                         std::string* why) {
    if (::geteuid() != 0) {
      *why = "needs root to make cgroups";
      return nullptr;
    }
    for (const auto& [mount, own] : Hierarchies()) {
      std::unique_ptr<PodCgroup> c(new PodCgroup);
      c->uid_ = pod_uid;
      c->mount_ = mount;
      c->home_ = mount + own;
      std::string path = mount;
      bool ok = true;
      for (const std::string& part :
           {std::string("kubepods"), std::string("besteffort"), "pod" + pod_uid, container}) {
        path += "/" + part;
        if (::mkdir(path.c_str(), 0755) == 0) {
          c->made_.push_back(path);
        } else if (errno != EEXIST) {
          *why = path + ": mkdir: " + std::strerror(errno);
          ok = false;
          break;
        }
      }
      c->leaf_ = path;
      if (ok) return c;
    }
    if (why->empty()) *why = "no cgroup v2 or v1 pids hierarchy is mounted";
    return nullptr;
  }
  ~PodCgroup() {
    for (pid_t p : added_) std::ofstream(home_ + "/cgroup.procs") << p << "\n";
    for (auto it = made_.rbegin(); it != made_.rend(); ++it) ::rmdir(it->c_str());
  }
  PodCgroup(const PodCgroup&) = delete;
  PodCgroup& operator=(const PodCgroup&) = delete;

  // Moves process `pid` into the pod's container cgroup.
  bool Add(pid_t pid) {
    std::ofstream procs(leaf_ + "/cgroup.procs");
    procs << pid << "\n";
    procs.flush();
    if (!procs) return false;
    added_.push_back(pid);
    return true;
  }
  const std::string& path() const { return leaf_; }
  const std::string& uid() const { return uid_; }

 private:
  PodCgroup() = default;
  // (mount point, this process's cgroup in it), v2 first, then v1 pids.
  static std::vector<std::pair<std::string, std::string>> Hierarchies() {
    std::vector<std::pair<std::string, std::string>> out;
    std::string v2_own, pids_own;
    std::ifstream cg("/proc/self/cgroup");
    for (std::string line; std::getline(cg, line);) {
      if (line.rfind("0::", 0) == 0) v2_own = line.substr(3);
      if (line.find(":pids:") != std::string::npos) pids_own = line.substr(line.rfind(':') + 1);
    }
    std::ifstream mi("/proc/self/mountinfo");
    std::string v2, pids;
    for (std::string line; std::getline(mi, line);) {
      std::istringstream f(line);
      std::vector<std::string> w;
      for (std::string s; f >> s;) w.push_back(s);
      size_t dash = 0;
      while (dash < w.size() && w[dash] != "-") ++dash;
      if (dash + 3 >= w.size() || w.size() < 5 || w[3] != "/") continue;  // a bind of a subtree
      if (w[dash + 1] == "cgroup2" && v2.empty()) v2 = w[4];
      if (w[dash + 1] == "cgroup" && w[dash + 3].find("pids") != std::string::npos) pids = w[4];
    }
    if (!v2.empty()) out.emplace_back(v2, v2_own == "/" ? "" : v2_own);
    if (!pids.empty()) out.emplace_back(pids, pids_own == "/" ? "" : pids_own);
    return out;
  }

  std::string uid_, mount_, home_, leaf_;
  std::vector<std::string> made_;
  std::vector<pid_t> added_;
};

}  // namespace weightcache::testing
