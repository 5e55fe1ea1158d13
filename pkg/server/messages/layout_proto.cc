#include "pkg/server/messages/layout_proto.h"

namespace weightcache::server {

void LayoutToProto(const spec::Layout& layout, v1::Layout* out) {
  out->set_tp_size(layout.tp_size);
  out->set_tp_rank(layout.tp_rank);
  out->set_pp_size(layout.pp_size);
  out->set_pp_rank(layout.pp_rank);
}

spec::Layout LayoutFromProto(const v1::Layout& layout) {
  return {static_cast<int>(layout.tp_size()), static_cast<int>(layout.tp_rank()),
          static_cast<int>(layout.pp_size()), static_cast<int>(layout.pp_rank())};
}

}  // namespace weightcache::server
