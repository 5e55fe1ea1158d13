#include "pkg/tenant/cgroup.h"

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace weightcache::tenant {
namespace {

bool IsHex(absl::string_view s) {
  for (char c : s) {
    if (!absl::ascii_isxdigit(static_cast<unsigned char>(c))) return false;
  }
  return !s.empty();
}

// A pod UID as the path writes it (`sep` between the UUID's groups: '-' for cgroupfs, '_' for
// systemd), normalised to lower case with dashes; nullopt when it is not one. Static pods'
// UIDs are 32 hex digits without separators.
std::optional<std::string> PodUid(absl::string_view s, char sep) {
  if (s.size() == 32 && IsHex(s)) return absl::AsciiStrToLower(std::string(s));
  if (s.size() != 36) return std::nullopt;
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    const bool at_sep = i == 8 || i == 13 || i == 18 || i == 23;
    if (at_sep != (s[i] == sep)) return std::nullopt;
    if (!at_sep && !absl::ascii_isxdigit(static_cast<unsigned char>(s[i]))) return std::nullopt;
    out.push_back(at_sep ? '-' : absl::ascii_tolower(static_cast<unsigned char>(s[i])));
  }
  return out;
}

// The container id a path segment below the pod names: "cri-containerd-<id>.scope",
// "crio-<id>.scope", "docker-<id>.scope" (systemd); "<id>", "crio-<id>" (cgroupfs).
std::string ContainerOf(absl::string_view seg) {
  absl::ConsumeSuffix(&seg, ".scope");
  for (absl::string_view prefix : {"cri-containerd-", "crio-conmon-", "crio-", "docker-"}) {
    if (absl::ConsumePrefix(&seg, prefix)) break;
  }
  return IsHex(seg) ? std::string(seg) : std::string();
}

// cgroupfs: "pod<UID>" right below kubepods, a QoS class, or a part hidden by a cgroup
// namespace ("..").
std::optional<std::string> CgroupfsPod(absl::string_view seg, absl::string_view parent) {
  if (!absl::ConsumePrefix(&seg, "pod")) return std::nullopt;
  if (parent != "kubepods" && parent != "burstable" && parent != "besteffort" && parent != "..") {
    return std::nullopt;
  }
  return PodUid(seg, '-');
}

// systemd: "[<root>-]kubepods[-burstable|-besteffort]-pod<UID_>.slice".
std::optional<std::string> SystemdPod(absl::string_view seg) {
  if (!absl::ConsumeSuffix(&seg, ".slice")) return std::nullopt;
  const size_t at = seg.rfind("-pod");
  if (at == absl::string_view::npos) return std::nullopt;
  absl::string_view head = seg.substr(0, at);
  if (!absl::EndsWith(head, "kubepods") && !absl::EndsWith(head, "kubepods-burstable") &&
      !absl::EndsWith(head, "kubepods-besteffort")) {
    return std::nullopt;
  }
  return PodUid(seg.substr(at + 4), '_');
}

}  // namespace

absl::StatusOr<std::vector<CgroupLine>> ParseProcCgroup(absl::string_view content) {
  std::vector<CgroupLine> out;
  for (absl::string_view line : absl::StrSplit(content, '\n', absl::SkipEmpty())) {
    // The path may itself hold ':' (cgroup names are free-form): split at the first two.
    const size_t a = line.find(':');
    const size_t b = a == absl::string_view::npos ? a : line.find(':', a + 1);
    if (b == absl::string_view::npos || a == 0 || line.size() == b + 1 || line[b + 1] != '/') {
      return absl::InvalidArgumentError(
          absl::StrCat("cgroup line '", line.substr(0, 200),
                       "' is not 'ID:controllers:/path' (/proc/PID/cgroup format)"));
    }
    out.push_back({std::string(line.substr(0, a)), std::string(line.substr(a + 1, b - a - 1)),
                   std::string(line.substr(b + 1))});
  }
  return out;
}

std::optional<PodRef> PodOfPath(absl::string_view path) {
  const std::vector<absl::string_view> segs = absl::StrSplit(path, '/', absl::SkipEmpty());
  for (size_t i = 0; i < segs.size(); ++i) {
    std::optional<std::string> uid = SystemdPod(segs[i]);
    const char* driver = "systemd";
    if (!uid) {
      uid = CgroupfsPod(segs[i], i > 0 ? segs[i - 1] : absl::string_view());
      driver = "cgroupfs";
    }
    if (!uid) continue;
    return PodRef{*uid, i + 1 < segs.size() ? ContainerOf(segs[i + 1]) : std::string(), driver};
  }
  return std::nullopt;
}

std::optional<PodRef> PodOfLines(const std::vector<CgroupLine>& lines) {
  std::optional<PodRef> found;
  for (const CgroupLine& l : lines) {
    std::optional<PodRef> pod = PodOfPath(l.path);
    if (!pod) continue;
    if (found && found->uid != pod->uid) return std::nullopt;  // lines disagree: no pod
    // The unified (v2) line names the container most precisely; otherwise the first.
    if (!found || l.hierarchy == "0") found = std::move(pod);
  }
  return found;
}

}  // namespace weightcache::tenant
