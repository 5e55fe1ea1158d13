#include "pkg/server/internal/publish_base.h"

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
