#include "pkg/tenant/unit.h"

#include "absl/strings/str_cat.h"

namespace weightcache::tenant {

std::string Unit::Key() const {
  switch (kind) {
    case UnitKind::kPod:
      return absl::StrCat("pod:", pod);
    case UnitKind::kSlot:
      return absl::StrCat("slot:", slot);
    case UnitKind::kProcess:
      return absl::StrCat("process:", pid, "/", start_ticks);
    case UnitKind::kUnknown:
      break;
  }
  return kUnresolvedKey;
}

std::string Unit::Describe() const {
  switch (kind) {
    case UnitKind::kPod:
      if (!pod_name.empty()) return absl::StrCat("pod ", pod_namespace, "/", pod_name);
      return absl::StrCat("pod ", pod);
    case UnitKind::kSlot:
      return absl::StrCat("slot ", slot);
    case UnitKind::kProcess:
      return absl::StrCat("process ", pid);
    case UnitKind::kUnknown:
      break;
  }
  return absl::StrCat("an unresolved peer (pid ", pid, ")");
}

}  // namespace weightcache::tenant
