#include "pkg/server/internal/publish_base.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "pkg/server/options.h"
#include "pkg/server/policy/namespace_rules.h"
#include "pkg/util/status_macros.h"

namespace weightcache::server {

absl::StatusOr<PublishBase::Placement> CorePublishBase::Place(const v1::Layout& layout,
                                                              const v1::Environment& env) const {
  Placement p;
  WC_ASSIGN_OR_RETURN(p.layout, admission_.LayoutFrom(layout));
  WC_ASSIGN_OR_RETURN(Admission::AskedEnv asked, admission_.EnvFrom(env));
  p.env = asked.env;
  p.device_uuid = asked.device_uuid.empty()
                      ? DefaultDeviceForRank(backend_->Devices(), p.layout.tp_rank)
                      : asked.device_uuid;
  return p;
}

absl::Status CoreArtifactRules::VouchesForNative(const std::string& model,
                                                 const artifact::Publisher& who,
                                                 const std::string& pool) const {
  if (who.admin) return absl::OkStatus();
  // Who put it, in the spec's forms: its pool names it (a pod's namespace, or uid:<n> on the
  // engine socket with the namespace rules); with one pool, uid:<n> of a put on the engine
  // socket (slot sockets exist only with the rules).
  std::string name = pool;
  if (name.empty() && who.slot.empty()) name = absl::StrCat("uid:", who.uid);
  const std::optional<spec::ModelSpec> spec = models_.Spec(model);
  const std::vector<std::string> named =
      spec ? spec->native_publishers : std::vector<std::string>{};
  if (!name.empty() && std::find(named.begin(), named.end(), name) != named.end()) {
    return absl::OkStatus();
  }
  return absl::PermissionDeniedError(absl::StrCat(
      "native code of model '", model, "' put by uid ", who.uid,
      who.slot.empty() ? "" : " on slot " + who.slot, pool.empty() ? "" : " into pool " + pool,
      " is not served: engines load only admins' native code and that of the publishers the "
      "spec names for it (native_publishers: [",
      absl::StrJoin(named, ", "), "]), and ",
      name.empty() ? std::string("nothing names this publisher") : name + " is not named"));
}

// Per-namespace pools, reservations, puts per tenant unit (issue 47).
absl::StatusOr<std::unique_ptr<ArtifactService>> MakeArtifactService(const DaemonOptions& o,
                                                                     const ArtifactRules& rules) {
  WC_ASSIGN_OR_RETURN(auto store,
                      artifact::Store::Open({o.artifact_budget_bytes, o.artifact_max_bytes,
                                             o.artifact_dir, o.artifact_dir_budget_bytes}));
  return std::make_unique<ArtifactService>(
      ArtifactService::Options{
          .handle_socket = HandleSocketPath(o),
          .slot_handle_socket = SlotHandleSocketInContainer(o.socket_dir, o.namespace_rules),
          .dir = o.artifact_dir,
          .token_ttl = o.token_ttl,
          .puts = {.max_total = o.artifact_max_puts,
                   .max_per_unit = o.artifact_max_puts_per_unit,
                   .idle = o.artifact_put_idle,
                   .total = o.artifact_put_total},
          // No budget: the store refuses every put itself, naming --artifact_budget.
          .reserve_per_unit = o.artifact_budget_bytes == 0 ? net::KeyedLimiter::kUnbounded
                                                           : ArtifactReservePerUnit(o),
          .reserve_tenants = o.artifact_budget_bytes == 0
                                 ? net::KeyedLimiter::kUnbounded
                                 : o.artifact_budget_bytes - ArtifactReservePerUnit(o)},
      std::move(store), rules, o.metrics);
}

}  // namespace weightcache::server
