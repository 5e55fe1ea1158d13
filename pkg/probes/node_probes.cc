#include "pkg/probes/node_probes.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <fstream>
#include <set>
#include <sstream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "pkg/util/errno_status.h"
#include "pkg/util/log.h"
#include "pkg/util/scoped_fd.h"

namespace weightcache::probes {
namespace {

// The flags behind each x86 ISA Inductor checks, in its order, and the flags whose presence
// adds a probe: generated from python/weightcache/cpu_isa.json, the table weightcache.probes
// reads (pkg/probes/CMakeLists.txt).
struct Isa {
  const char* name;
  std::vector<const char*> needs;
};
#include "pkg/probes/cpu_isa_table.inc"

std::set<std::string, std::less<>> FirstFlags(absl::string_view cpuinfo) {
  for (absl::string_view line : absl::StrSplit(cpuinfo, '\n')) {
    const size_t colon = line.find(':');
    if (colon == absl::string_view::npos) continue;
    absl::string_view key = absl::StripAsciiWhitespace(line.substr(0, colon));
    if (key != "flags" && key != "Features") continue;
    std::set<std::string, std::less<>> out;
    for (absl::string_view f : absl::StrSplit(line.substr(colon + 1), ' ', absl::SkipEmpty())) {
      out.emplace(absl::StripAsciiWhitespace(f));
    }
    return out;
  }
  return {};
}

std::string JsonList(const std::vector<std::string>& items) {
  std::vector<std::string> quoted;
  quoted.reserve(items.size());
  for (const auto& s : items) quoted.push_back(absl::StrCat("\"", s, "\""));
  return absl::StrCat("[", absl::StrJoin(quoted, ", "), "]");
}

}  // namespace

std::string NodeProbesJson(absl::string_view cpuinfo, absl::string_view machine) {
  const auto flags = FirstFlags(cpuinfo);
  std::vector<std::string> isas;
  if (machine == "x86_64" || machine == "AMD64") {
    for (const auto& isa : X86Isas()) {
      if (std::all_of(isa.needs.begin(), isa.needs.end(),
                      [&](const char* f) { return flags.count(f) != 0; })) {
        isas.emplace_back(isa.name);
      }
    }
  }
  std::vector<std::string> probe_flags;
  for (const char* f : ProbeFlagNames()) {
    if (flags.count(f) != 0) probe_flags.emplace_back(f);
  }
  std::sort(probe_flags.begin(), probe_flags.end());
  // Machine names are uname's ([A-Za-z0-9_]): nothing to escape.
  return absl::StrCat("{\"cpu_isa\": ", JsonList(isas), ", \"machine\": \"", machine,
                      "\", \"probe_flags\": ", JsonList(probe_flags), ", \"version\": 1}");
}

std::string ThisNodeProbesJson() {
  std::ifstream in("/proc/cpuinfo");
  std::stringstream text;
  text << in.rdbuf();
  struct utsname u {};
  const std::string machine = ::uname(&u) == 0 ? u.machine : "";
  return NodeProbesJson(text.str(), machine);
}

absl::Status WriteNodeProbes(const std::string& dir, absl::string_view json) {
  const std::string path = absl::StrCat(dir, "/", kNodeProbesFile);
  const std::string tmp = absl::StrCat(dir, "/.", kNodeProbesFile, ".", ::getpid());
  // A file left at the temporary name (a crash, or someone who may write the directory) is
  // removed, never reused: O_EXCL makes this write's file a new one, owned by the daemon.
  ::unlink(tmp.c_str());
  ScopedFd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644));
  if (!fd.valid()) return ErrnoStatus(errno, "open", tmp);
  const std::string text = absl::StrCat(json, "\n");
  // 0644 whatever the umask: engines of every uid read it.
  if (::fchmod(fd.get(), 0644) != 0 ||
      ::write(fd.get(), text.data(), text.size()) != static_cast<ssize_t>(text.size())) {
    const int err = errno;
    ::unlink(tmp.c_str());
    return ErrnoStatus(err, "write", tmp);
  }
  fd.reset();
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    return ErrnoStatus(err, "rename", path);
  }
  return absl::OkStatus();
}

void WriteNodeProbesInto(const std::vector<std::string>& dirs) {
  const std::string json = ThisNodeProbesJson();
  for (const auto& dir : dirs) {
    if (auto st = WriteNodeProbes(dir, json); !st.ok()) {
      WC_LOG_WARN("node probes not written (engines decide them themselves): %s",
                  st.ToString().c_str());
    }
  }
}

std::vector<std::pair<std::string, std::vector<std::string>>> X86IsaTable() {
  std::vector<std::pair<std::string, std::vector<std::string>>> out;
  for (const auto& isa : X86Isas())
    out.emplace_back(isa.name, std::vector<std::string>(isa.needs.begin(), isa.needs.end()));
  return out;
}

std::vector<std::string> ProbeFlags() { return {ProbeFlagNames().begin(), ProbeFlagNames().end()}; }

}  // namespace weightcache::probes
