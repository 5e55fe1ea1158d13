// Registry: the leases on entries (who maps what), apart from loading and eviction.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "pkg/cache/registry.h"
#include "pkg/util/log.h"

namespace weightcache::cache {

absl::Status Registry::AddLease(const std::shared_ptr<Entry>& e, const LeaseRecord& lease) {
  MutexLock l(mu_);
  if (e->state != State::kReady) {
    return absl::UnavailableError(
        absl::StrCat("model '", e->model, "' is ", StateName(e->state), ", not ready"));
  }
  e->leases[lease.id] = lease;
  e->last_used = std::chrono::steady_clock::now();
  lease_to_entry_[lease.id] = e;
  return absl::OkStatus();
}

void Registry::SetLeasePeer(const std::string& lease_id, int pid, int uid) {
  MutexLock l(mu_);
  auto it = lease_to_entry_.find(lease_id);
  if (it == lease_to_entry_.end()) return;
  auto lease = it->second->leases.find(lease_id);
  if (lease == it->second->leases.end()) return;
  lease->second.pid = pid;
  lease->second.uid = uid;
  lease->second.claimed = true;
}

bool Registry::RemoveLease(const std::string& lease_id) {
  std::shared_ptr<const load::LoadedModel> drop;  // a drained entry's memory, freed unlocked
  {
    MutexLock l(mu_);
    auto it = lease_to_entry_.find(lease_id);
    if (it == lease_to_entry_.end()) return false;
    std::shared_ptr<Entry> e = it->second;
    lease_to_entry_.erase(it);
    e->leases.erase(lease_id);
    e->last_used = std::chrono::steady_clock::now();
    if (e->state == State::kDraining && e->leases.empty()) {
      drop = std::move(e->watched);
      e->reserved_bytes = 0;
      e->state = State::kGone;
      draining_.erase(std::remove(draining_.begin(), draining_.end(), e), draining_.end());
      WC_LOG_INFO("model %s (%s) drained: its last lease ended", e->model, e->key.ToString());
    }
  }
  return true;
}

std::optional<LeaseRecord> Registry::FindLease(const std::string& lease_id) const {
  MutexLock l(mu_);
  auto it = lease_to_entry_.find(lease_id);
  if (it == lease_to_entry_.end()) return std::nullopt;
  auto lease = it->second->leases.find(lease_id);
  if (lease == it->second->leases.end()) return std::nullopt;
  return lease->second;
}

bool Registry::HasLease(const std::shared_ptr<Entry>& e, const std::string& lease_id) const {
  MutexLock l(mu_);
  auto it = lease_to_entry_.find(lease_id);
  return it != lease_to_entry_.end() && it->second == e;
}

size_t Registry::LeaseCount(const Key& key) const {
  MutexLock l(mu_);
  auto it = entries_.find(key);
  return it == entries_.end() ? 0 : it->second->leases.size();
}

}  // namespace weightcache::cache
