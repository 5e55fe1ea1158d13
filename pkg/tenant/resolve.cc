#include "pkg/tenant/resolve.h"

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "pkg/tenant/cgroup.h"
#include "pkg/util/log.h"

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

}  // namespace

uint64_t StartTicksOfStat(const std::string& stat) {
  const size_t close = stat.rfind(')');
  if (close == std::string::npos) return 0;
  // After ") ": field 3 (state) is the first; starttime is field 22, the 20th from there.
  const std::vector<absl::string_view> f =
      absl::StrSplit(absl::string_view(stat).substr(close + 1), ' ', absl::SkipEmpty());
  if (f.size() < 20) return 0;
  return std::strtoull(std::string(f[19]).c_str(), nullptr, 10);
}

Unit Resolver::Resolve(pid_t pid) const {
  Unit u;
  u.pid = pid;
  if (pid <= 0) {
    unknown_++;
    if (!warned_.exchange(true)) {
      WC_LOG_WARN(
          "a peer's pid is not visible in this pid namespace (SO_PEERCRED reports 0): peers "
          "that are not told apart by pod share one tenant unit; run the daemon with hostPID "
          "(the chart's daemon.hostPID) so leases and connection caps are per pod");
    }
    return u;
  }
  const std::string dir = absl::StrCat(proc_root_, "/", pid);
  u.start_ticks = StartTicksOfStat(ReadSmallFile(dir + "/stat"));
  auto lines = ParseProcCgroup(ReadSmallFile(dir + "/cgroup"));
  if (lines.ok()) {
    if (std::optional<PodRef> pod = PodOfLines(*lines)) {
      u.kind = UnitKind::kPod;
      u.pod = pod->uid;
      u.container = pod->container;
      pods_++;
      return u;
    }
  }
  if (u.start_ticks == 0) {  // gone before it was read: nothing says who it was
    unknown_++;
    return u;
  }
  u.kind = UnitKind::kProcess;
  processes_++;
  return u;
}

Resolver::Counts Resolver::counts() const { return {pods_, processes_, unknown_}; }

}  // namespace weightcache::tenant
