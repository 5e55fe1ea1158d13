#include "pkg/server/internal/publish_base.h"

#include "pkg/server/options.h"
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

}  // namespace weightcache::server
