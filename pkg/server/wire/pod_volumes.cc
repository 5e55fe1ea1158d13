#include "pkg/server/wire/pod_volumes.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "pkg/util/errno_status.h"
#include "pkg/util/log.h"
#include "pkg/util/status_macros.h"

namespace weightcache::server {
namespace {

constexpr char kControl[] = "/control.sock";
constexpr char kHandle[] = "/handle.sock";

tenant::Unit UnitOf(const kube::PodVolume& v) {
  return tenant::Unit::OfNamedPod(v.pod_uid, v.pod_namespace, v.pod_name, v.service_account, 0);
}

nlohmann::json ToJson(const kube::PodVolume& v) {
  return {{"volume_id", v.volume_id},
          {"target_path", v.target_path},
          {"pod_namespace", v.pod_namespace},
          {"pod_name", v.pod_name},
          {"pod_uid", v.pod_uid},
          {"service_account", v.service_account}};
}

}  // namespace

PodVolumes::PodVolumes(std::string state_file, ControlListener* control, HandleChannel* handles)
    : state_file_(std::move(state_file)), control_(control), handles_(handles) {}

size_t PodVolumes::size() const {
  MutexLock l(mu_);
  return volumes_.size();
}

absl::Status PodVolumes::Serve(const kube::PodVolume& v) {
  if (::mkdir(v.target_path.c_str(), 0755) != 0 && errno != EEXIST) {
    return ErrnoStatus(errno, "creating the volume's directory " + v.target_path);
  }
  // The pod's containers run as any uid: its directory must let them reach the sockets.
  if (::chmod(v.target_path.c_str(), 0755) != 0) {
    return ErrnoStatus(errno, "chmod 0755 " + v.target_path);
  }
  const tenant::Unit unit = UnitOf(v);
  WC_RETURN_IF_ERROR(control_->AddPodSocket(v.target_path + kControl, unit));
  if (absl::Status s = handles_->AddPodSocket(v.target_path + kHandle, unit); !s.ok()) {
    control_->RemovePodSocket(v.pod_uid);
    return s;
  }
  return absl::OkStatus();
}

void PodVolumes::StopServing(const kube::PodVolume& v) {
  control_->RemovePodSocket(v.pod_uid);
  handles_->RemovePodSocket(v.pod_uid);
  if (::rmdir(v.target_path.c_str()) != 0 && errno != ENOENT) {
    WC_LOG_WARN("pod volume %s: removing %s: %s", v.volume_id, v.target_path, std::strerror(errno));
  }
}

void PodVolumes::Stop() {
  MutexLock l(mu_);
  stopped_ = true;
}

absl::Status PodVolumes::Publish(const kube::PodVolume& v) {
  MutexLock l(mu_);
  if (stopped_) return absl::UnavailableError("the daemon is stopping; the kubelet retries");
  if (auto it = volumes_.find(v.volume_id); it != volumes_.end()) {
    if (it->second.target_path != v.target_path || it->second.pod_uid != v.pod_uid) {
      return absl::AlreadyExistsError(absl::StrCat("volume ", v.volume_id, " is published at ",
                                                   it->second.target_path, " for pod ",
                                                   it->second.pod_uid, " already"));
    }
    return Serve(v);  // again: the sockets may have been removed meanwhile
  }
  for (const auto& [id, other] : volumes_) {
    if (other.pod_uid == v.pod_uid) {
      return absl::FailedPreconditionError(absl::StrCat("pod ", v.pod_namespace, "/", v.pod_name,
                                                        " has weightcache volume ", id, " at ",
                                                        other.target_path,
                                                        " already: one per pod (its containers "
                                                        "share it)"));
    }
  }
  WC_RETURN_IF_ERROR(Serve(v));
  volumes_[v.volume_id] = v;
  if (absl::Status s = Save(); !s.ok()) {
    volumes_.erase(v.volume_id);
    StopServing(v);
    return s;
  }
  return absl::OkStatus();
}

absl::Status PodVolumes::Unpublish(const std::string& volume_id, const std::string& target_path) {
  MutexLock l(mu_);
  if (stopped_) return absl::UnavailableError("the daemon is stopping; the kubelet retries");
  auto it = volumes_.find(volume_id);
  if (it == volumes_.end()) return absl::OkStatus();
  if (it->second.target_path != target_path) {
    return absl::InvalidArgumentError(absl::StrCat("volume ", volume_id, " is published at ",
                                                   it->second.target_path, ", not at ",
                                                   target_path));
  }
  StopServing(it->second);
  volumes_.erase(it);
  return Save();
}

absl::Status PodVolumes::Save() const {
  if (state_file_.empty()) return absl::OkStatus();
  nlohmann::json all = nlohmann::json::array();
  for (const auto& [id, v] : volumes_) all.push_back(ToJson(v));
  const std::string tmp = state_file_ + ".tmp";
  const std::string dir = std::filesystem::path(state_file_).parent_path();
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return ErrnoStatus(errno, "creating the daemon's state directory " + dir);
  }
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << nlohmann::json{{"version", 1}, {"volumes", all}}.dump(1) << "\n";
    out.flush();
    if (!out) return absl::InternalError("writing the pod volumes' record " + tmp);
  }
  if (std::rename(tmp.c_str(), state_file_.c_str()) != 0) {
    return ErrnoStatus(errno, "renaming " + tmp + " to " + state_file_);
  }
  return absl::OkStatus();
}

absl::Status PodVolumes::Restore() {
  if (state_file_.empty()) return absl::OkStatus();
  std::ifstream in(state_file_);
  if (!in) {
    if (errno == ENOENT) return absl::OkStatus();  // none published yet
    return ErrnoStatus(errno, "reading the pod volumes' record " + state_file_);
  }
  std::stringstream text;
  text << in.rdbuf();
  const nlohmann::json doc = nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object() || doc.value("version", 0) != 1 ||
      !doc.contains("volumes") || !doc["volumes"].is_array()) {
    return absl::DataLossError(absl::StrCat(
        "the pod volumes' record ", state_file_,
        " is not a version-1 record of volumes; move it away to start without it (the pods "
        "that had sockets lose them until they restart)"));
  }
  MutexLock l(mu_);
  for (const auto& j : doc["volumes"]) {
    kube::PodVolume v;
    v.volume_id = j.value("volume_id", "");
    v.target_path = j.value("target_path", "");
    v.pod_namespace = j.value("pod_namespace", "");
    v.pod_name = j.value("pod_name", "");
    v.pod_uid = j.value("pod_uid", "");
    v.service_account = j.value("service_account", "");
    if (v.volume_id.empty() || v.pod_uid.empty() || v.target_path.empty()) continue;
    // The kubelet made the directory's parent for the pod: gone, the pod is gone.
    if (!std::filesystem::is_directory(std::filesystem::path(v.target_path).parent_path())) {
      WC_LOG_INFO("pod volume %s of pod %s/%s: its directory is gone; forgotten", v.volume_id,
                  v.pod_namespace, v.pod_name);
      continue;
    }
    if (absl::Status s = Serve(v); !s.ok()) {
      WC_LOG_WARN("pod volume %s of pod %s/%s: not served again: %s", v.volume_id, v.pod_namespace,
                  v.pod_name, std::string(s.message()));
      continue;
    }
    volumes_[v.volume_id] = v;
  }
  WC_LOG_INFO("pod volumes: %d served again from %s", volumes_.size(), state_file_);
  return Save();
}

}  // namespace weightcache::server
