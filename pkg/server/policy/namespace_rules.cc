#include "pkg/server/policy/namespace_rules.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "pkg/kube/device_plugin.h"
#include "pkg/util/log.h"
#include "pkg/util/status_macros.h"
#include "pkg/util/unix_socket.h"

namespace weightcache::server {

NamespaceRules::NamespaceRules(Options options, Lookup lookup)
    : options_(std::move(options)), lookup_(std::move(lookup)) {}

absl::StatusOr<std::unique_ptr<NamespaceRules>> NamespaceRules::Create(
    const NamespaceRulesOptions& options) {
  kube::PodResourcesClient::Options po;
  po.socket = options.pod_resources_socket;
  po.timeout = absl::FromChrono(options.pod_resources_timeout);
  WC_ASSIGN_OR_RETURN(std::shared_ptr<kube::PodResourcesClient> client,
                      kube::PodResourcesClient::Create(po));
  Options o;
  o.resource_name = options.resource_name;
  o.cache_ttl = options.cache_ttl;
  return std::make_unique<NamespaceRules>(
      o, [client, resource = options.resource_name] { return client->Holders(resource); });
}

absl::StatusOr<std::vector<SlotSockets>> PrepareSlotDirs(const std::string& socket_dir, int slots,
                                                         int socket_gid) {
  const std::string root = socket_dir + "/" + kube::kSlotsDirName;
  // Created 0750 with the engines' group; existing ones (a previous run's) used as they are.
  WC_RETURN_IF_ERROR(PrepareSocketDir(root, 0750, socket_gid));
  std::vector<SlotSockets> out;
  for (int i = 0; i < slots; ++i) {
    SlotSockets s;
    s.slot = kube::DeviceId(i);
    s.dir = kube::SlotSocketDir(socket_dir, s.slot);
    s.control = s.dir + "/" + kube::kControlSocketName;
    s.handle = s.dir + "/" + kube::kHandleSocketName;
    WC_RETURN_IF_ERROR(PrepareSocketDir(s.dir, 0750, socket_gid));
    WC_RETURN_IF_ERROR(RemoveStaleSocket(s.control, {.label = "", .server = "daemon"}));
    WC_RETURN_IF_ERROR(RemoveStaleSocket(s.handle, {.label = "", .server = "daemon"}));
    out.push_back(std::move(s));
  }
  return out;
}

std::string SocketOfSlot(const std::string& slot) {
  return slot.empty() ? std::string("the shared socket") : absl::StrCat("slot ", slot, "'s socket");
}

std::string SlotHandleSocketInContainer(const std::string& socket_dir,
                                        const NamespaceRulesOptions& rules) {
  const std::string& dir = rules.container_socket_dir;
  return (dir.empty() ? socket_dir : dir) + "/" + kube::kHandleSocketName;
}

absl::Status GroupSlotSockets(const std::vector<SlotSockets>& slots, int socket_gid) {
  if (socket_gid < 0) return absl::OkStatus();
  for (const auto& s : slots) {
    WC_RETURN_IF_ERROR(ChangeGroup(s.control, socket_gid));
    WC_RETURN_IF_ERROR(ChangeGroup(s.handle, socket_gid));
  }
  return absl::OkStatus();
}

uint64_t NamespaceRules::lookups() const {
  MutexLock l(mu_);
  return lookups_;
}

absl::StatusOr<kube::PodRef> NamespaceRules::PodOf(const std::string& slot,
                                                   std::chrono::steady_clock::time_point accepted) {
  {
    MutexLock l(mu_);
    auto it = by_slot_.find(slot);
    if (it != by_slot_.end() && it->second.fetched >= accepted &&
        std::chrono::steady_clock::now() - it->second.fetched < options_.cache_ttl) {
      return it->second.pod;
    }
  }
  // Asked outside the lock: a slow kubelet must not hold up answers the cache has.
  const auto fetched = std::chrono::steady_clock::now();
  absl::StatusOr<kube::DeviceHolders> holders = lookup_();
  MutexLock l(mu_);
  ++lookups_;
  if (!holders.ok()) return holders.status();
  // Every slot's answer is renewed together: slots no longer held are forgotten.
  by_slot_.clear();
  for (const auto& [device, pod] : holders->by_device) by_slot_[device] = {pod, fetched};
  if (holders->conflicting.count(slot) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("the kubelet reports slot ", slot, " allocated to more than one pod"));
  }
  auto it = by_slot_.find(slot);
  if (it == by_slot_.end()) {
    return absl::NotFoundError(absl::StrCat("the kubelet reports no pod holding slot ", slot, " (",
                                            options_.resource_name, ")"));
  }
  return it->second.pod;
}

absl::Status NamespaceRules::MayMap(const Who& who, const std::string& model,
                                    const std::vector<std::string>& allowed) {
  if (allowed.empty()) return absl::OkStatus();
  const std::string rule = absl::StrCat("model '", model, "' may be mapped from namespaces [",
                                        absl::StrJoin(allowed, ", "), "] only");
  if (who.slot.empty()) {
    if (who.admin) return absl::OkStatus();
    return absl::PermissionDeniedError(absl::StrCat(
        rule,
        "; this connection came in on the shared socket, which identifies no pod (engines "
        "connect through their device-plugin slot's socket; only admin peers map restricted "
        "models on the shared one)"));
  }
  absl::StatusOr<kube::PodRef> pod = PodOf(who.slot, who.accepted);
  if (!pod.ok()) {
    WC_LOG_WARN("namespace rules: slot %s: %s", who.slot, std::string(pod.status().message()));
    return absl::PermissionDeniedError(absl::StrCat(
        rule, "; the pod on slot ", who.slot,
        " could not be identified, so it is refused (fail closed): ", pod.status().message()));
  }
  if (std::find(allowed.begin(), allowed.end(), pod->ns) != allowed.end()) {
    return absl::OkStatus();
  }
  return absl::PermissionDeniedError(absl::StrCat(rule, "; this pod (", pod->ns, "/", pod->name,
                                                  ", slot ", who.slot, ") is in '", pod->ns, "'"));
}

}  // namespace weightcache::server
