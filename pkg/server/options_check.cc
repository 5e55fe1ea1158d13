// CheckOptions (options.h): the daemon's options that no operator means, refused at start
// naming the flag that sets them, rather than accepted and found out later (every model
// refused, every artifact put refused, a cap that never binds).
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "pkg/server/options.h"
#include "pkg/util/status_macros.h"

namespace weightcache::server {
namespace {

std::string Bytes(uint64_t b) { return absl::StrCat(b, " bytes"); }

// A path the daemon is given must not depend on the directory it was started in: a relative
// one means another file under another working directory (a DaemonSet's is the image's).
absl::Status Absolute(const char* flag, const std::string& path, const char* what) {
  if (path.empty() || path.front() == '/') return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(flag, "=", path, ": a relative path; ", what,
                                                 " must be absolute (not resolved against the "
                                                 "daemon's working directory)"));
}

// Model roots: absolute, and existing directories. A root that is missing or a file refuses
// every model_dir under it, which an operator finds only at the first load.
absl::Status CheckModelRoots(const std::vector<std::string>& roots) {
  for (const auto& r : roots) {
    if (r.empty()) return absl::InvalidArgumentError("--model_roots: an empty entry");
    WC_RETURN_IF_ERROR(Absolute("--model_roots", r, "a model root"));
    struct stat st {};
    if (::stat(r.c_str(), &st) != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--model_roots=", r, ": ", std::strerror(errno),
                       "; every model_dir must resolve under an existing directory, so no "
                       "model under this root could load"));
    }
    if (!S_ISDIR(st.st_mode)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--model_roots=", r, ": not a directory (a model root is one)"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckArtifactLimits(const DaemonOptions& o) {
  // A budget of 0 keeps no artifacts at all; the other limits then say nothing.
  if (o.artifact_budget_bytes > 0) {
    if (o.artifact_max_bytes == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--artifact_max_bytes=0: every artifact put would be refused; give the largest "
          "artifact to keep (at most --artifact_budget, ",
          Bytes(o.artifact_budget_bytes), "), or --artifact_budget=0 to keep none"));
    }
    if (o.artifact_max_bytes > o.artifact_budget_bytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--artifact_max_bytes (", Bytes(o.artifact_max_bytes), ") is above --artifact_budget (",
          Bytes(o.artifact_budget_bytes), "): an artifact that large could never be kept"));
    }
    if (o.artifact_reserve_per_unit_bytes > o.artifact_budget_bytes / 2) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--artifact_reserve_per_unit (", Bytes(o.artifact_reserve_per_unit_bytes),
          ") is above half of --artifact_budget (", Bytes(o.artifact_budget_bytes),
          "): the pods' puts share the budget less one such share (kept for the admin's "
          "puts), so one pod could hold all of it; give at most ",
          Bytes(o.artifact_budget_bytes / 2), ", or leave it empty for a quarter"));
    }
  }
  if (o.artifact_max_puts == 0) {
    return absl::InvalidArgumentError("--artifact_max_puts=0: every artifact put would be refused");
  }
  if (o.artifact_max_puts_per_unit > o.artifact_max_puts) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--artifact_max_puts_per_unit (", o.artifact_max_puts_per_unit,
        ") is above --artifact_max_puts (", o.artifact_max_puts,
        "): the per-pod cap would never bind, one pod could hold every put in flight"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckOptions(const DaemonOptions& o) {
  WC_RETURN_IF_ERROR(CheckModelRoots(o.model_roots));
  WC_RETURN_IF_ERROR(Absolute("--keeper_socket", o.keeper_socket,
                              "the keeper's socket ('off': "
                              "no keeper)"));
  WC_RETURN_IF_ERROR(Absolute("--container_socket_dir", o.namespace_rules.container_socket_dir,
                              "the socket dir's path inside engine containers (the kubelet "
                              "mounts it there)"));
  WC_RETURN_IF_ERROR(Absolute("--artifact_dir", o.artifact_dir, "the artifact directory"));
  if (o.namespace_rules.cache_ttl < std::chrono::milliseconds(0) ||
      o.namespace_rules.cache_ttl > std::chrono::hours(1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--pod_resources_cache=", o.namespace_rules.cache_ttl.count() / 1000.0,
                     ": must be in [0, 3600] seconds (0: an answer is never reused)"));
  }
  WC_RETURN_IF_ERROR(CheckArtifactLimits(o));
  if (o.max_connections < o.max_connections_per_pod) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max_connections (", o.max_connections, ") is below --max_connections_per_pod (",
        o.max_connections_per_pod,
        "): the per-pod cap would never bind, one pod could hold every connection; lower "
        "--max_connections_per_pod too"));
  }
  return absl::OkStatus();
}

}  // namespace weightcache::server
