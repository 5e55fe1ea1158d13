#include "pkg/server/internal/access.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "pkg/metrics/metrics.h"
#include "pkg/util/log.h"
#include "pkg/util/status_macros.h"

namespace weightcache::server {

absl::StatusOr<std::unique_ptr<Access>> Access::FromOptions(const DaemonOptions& options,
                                                            const ModelCatalog& models,
                                                            PeerLookup peer_of) {
  std::unique_ptr<NamespaceRules> rules;
  if (options.namespace_rules.enabled) {
    WC_ASSIGN_OR_RETURN(rules, NamespaceRules::Create(options.namespace_rules));
  }
  PolicyOptions po;
  po.admin_uids = options.admin_uids;
  po.admin_gids = options.admin_gids;
  po.publish_uids = options.publish_uids;
  po.publish_gids = options.publish_gids;
  po.publish_namespaces = options.publish_namespaces;
  po.admin_socket = AdminSocketPath(options);
  return std::make_unique<Access>(std::move(po), std::move(rules), models, std::move(peer_of),
                                  options.max_connections_per_pod, options.metrics);
}

Access::Access(PolicyOptions policy, std::unique_ptr<NamespaceRules> rules,
               const ModelCatalog& models, PeerLookup peer_of, size_t max_connections_per_pod,
               metrics::Metrics* metrics)
    : rules_(std::move(rules)),
      policy_(std::move(policy), rules_.get()),
      models_(models),
      peer_of_(std::move(peer_of)),
      max_connections_per_pod_(max_connections_per_pod),
      metrics_(metrics) {}

absl::StatusOr<Caller> Access::CallerOf(const std::string& grpc_peer) const {
  std::optional<Caller> c = peer_of_ ? peer_of_(grpc_peer) : std::nullopt;
  if (!c) {
    return absl::PermissionDeniedError("control connection of an unknown peer (" + grpc_peer + ")");
  }
  if (c->over_cap) {
    if (metrics_ != nullptr) metrics_->OnRefused("connection_cap");
    if (c->unit.unresolved()) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "control socket: ", c->unit.Describe(),
          ": every peer the daemon cannot tell by pod "
          "or process (gone, a zombie, or its pid not visible) shares one unit, which holds ",
          c->unit_connections, " connections, over its cap of ", c->unit_cap,
          " (--max_connections_unresolved); close some and reconnect"));
    }
    return absl::ResourceExhaustedError(
        absl::StrCat("control socket: ", c->unit.Describe(), " holds ", c->unit_connections,
                     " connections, over the cap of ", max_connections_per_pod_,
                     " per pod (--max_connections_per_pod); close some and reconnect"));
  }
  return *c;
}

absl::Status Access::Check(const Caller& caller, Verb verb, const Object& object) const {
  const Decision d = policy_.Decide(caller, verb, object);
  return d.allowed ? absl::OkStatus() : absl::PermissionDeniedError(d.reason);
}

bool Access::Allows(const Caller& caller, Verb verb, const Object& object) const {
  return policy_.Decide(caller, verb, object).allowed;
}

absl::Status Access::Authorize(const Caller& caller, Verb verb, const Object& object) const {
  const Decision d = policy_.Decide(caller, verb, object);
  if (d.allowed) return absl::OkStatus();
  return Refuse(d.rule, d.reason);
}

absl::Status Access::AuthorizePublish(const Caller& caller, const std::string& model,
                                      bool native) const {
  Object o = model.empty() ? Object{} : ModelObject(model);
  o.model = model;
  o.native = native;
  return Authorize(caller, Verb::kPublish, o);
}

absl::Status Access::Refuse(const std::string& rule, const std::string& message) const {
  if (metrics_ != nullptr) metrics_->OnRefused(rule);
  WC_LOG_WARN("refused (%s): %s", rule, message);
  return absl::PermissionDeniedError(message);
}

std::string Access::MetricModel(const std::string& name) const {
  return !name.empty() && models_.Spec(name).has_value() ? name : std::string();
}

Object Access::ModelObject(const std::string& name) const {
  Object o;
  o.model = name;
  if (const std::optional<spec::ModelSpec> spec = models_.Spec(name)) {
    o.allowed_namespaces = spec->allowed_namespaces;
    o.publishers = spec->publishers;
    o.native_publishers = spec->native_publishers;
  }
  return o;
}

absl::StatusOr<std::string> Access::TenantFor(const Caller& caller, const std::string& name) const {
  const std::optional<spec::ModelSpec> spec = models_.Spec(name);
  if (!spec || !spec->Private()) return std::string();
  return policy_.TenantOf(caller, name);
}

absl::StatusOr<std::string> Access::ArtifactPool(const Caller& caller,
                                                 const std::string& name) const {
  if (rules_ == nullptr) return TenantFor(caller, name);
  if (policy_.IsAdmin(caller)) return std::string();
  if (caller.socket == SocketKind::kSlot || caller.socket == SocketKind::kPod) {
    return policy_.TenantOf(caller, name);
  }
  return absl::StrCat("uid:", caller.cred.uid);
}

absl::StatusOr<std::vector<std::string>> Access::TenantsToLoad(const Caller* caller,
                                                               const spec::ModelSpec& spec) const {
  if (!spec.Private()) return std::vector<std::string>{""};
  if (caller != nullptr &&
      (caller->socket == SocketKind::kSlot || caller->socket == SocketKind::kPod)) {
    WC_ASSIGN_OR_RETURN(std::string ns, policy_.TenantOf(*caller, spec.name));
    return std::vector<std::string>{ns};
  }
  if (spec.allowed_namespaces.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "model '", spec.name,
        "' keeps a private copy per namespace (isolation: namespace) and lists no "
        "allowed_namespaces, so there is no namespace to load it for: each namespace's copy is "
        "loaded when a pod of it asks (acquire with load_on_miss, or load through its slot)"));
  }
  return spec.allowed_namespaces;
}

// A private copy per namespace needs to know the namespace of whoever asks: only the
// namespace rules' slot sockets say it.
absl::Status CheckIsolation(const spec::ModelSpec& spec, bool rules_enabled) {
  if (!spec.Private() || rules_enabled) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "model '", spec.name,
      "': isolation: namespace (a private copy per Kubernetes namespace) needs the daemon's "
      "--namespace_rules, which identify each caller's pod; without them no caller names a "
      "namespace (set namespaceRules.enabled in the chart, or use isolation: shared)"));
}

}  // namespace weightcache::server
