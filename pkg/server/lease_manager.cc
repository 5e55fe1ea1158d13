#include "pkg/server/internal/lease_manager.h"

#include <sys/random.h>

#include <cerrno>
#include <vector>

#include "absl/strings/str_cat.h"
#include "pkg/server/policy/namespace_rules.h"
#include "pkg/util/bytes.h"
#include "pkg/util/log.h"
#include "pkg/util/status_macros.h"

namespace weightcache::server {

absl::StatusOr<LeaseManager::Issued> LeaseManager::Issue(
    const std::shared_ptr<cache::Entry>& e, const std::string& name, const Caller& owner,
    const std::function<void(const std::string&)>& before_lease) {
  const std::string& slot = owner.slot;
  const std::string evicted =
      absl::StrCat("model '", name, "' was evicted between its lookup and its lease; ask again");
  auto content = registry_->Content(e);
  if (!content.ok()) return absl::UnavailableError(evicted);
  if (before_lease) before_lease(name);
  Issued out{RandomHex(16), RandomHex(32), *std::move(content)};
  cache::LeaseRecord rec;
  rec.id = out.lease_id;
  rec.pid = static_cast<int>(owner.cred.pid);
  rec.uid = static_cast<int>(owner.cred.uid);
  rec.since = std::chrono::steady_clock::now();
  rec.owner_uid = static_cast<int>(owner.cred.uid);
  rec.owner_unit = owner.unit.Key();
  if (!owner.unit.pod_name.empty()) {
    rec.owner_pod = owner.unit.pod_namespace + "/" + owner.unit.pod_name;
  }
  rec.slot = slot;
  if (!registry_->AddLease(e, rec).ok()) return absl::UnavailableError(evicted);
  MutexLock l(mu_);
  tokens_[out.token] = {out.lease_id, e, std::chrono::steady_clock::now() + token_ttl_, slot};
  return out;
}

absl::StatusOr<HandleChannel::Grant> LeaseManager::Claim(const std::string& token,
                                                         const PeerCred& peer,
                                                         const std::string& slot) {
  PendingToken pending;
  {
    MutexLock l(mu_);
    auto it = tokens_.find(token);
    if (it == tokens_.end()) return absl::PermissionDeniedError("unknown or expired token");
    if (it->second.slot != slot) {
      WC_LOG_WARN("lease %s: token presented on %s, issued on %s; refused", it->second.lease_id,
                  SocketOfSlot(slot), SocketOfSlot(it->second.slot));
      return absl::PermissionDeniedError(absl::StrCat(
          "this token was issued on ", SocketOfSlot(it->second.slot),
          " and is claimable only on the handle socket beside it, not on ", SocketOfSlot(slot)));
    }
    pending = it->second;
    tokens_.erase(it);
  }
  // The lease's own entry: after an evict and a reload under the same key, the new entry's
  // descriptors are not this lease's to take.
  if (!registry_->HasLease(pending.entry, pending.lease_id)) {
    return absl::UnavailableError("the lease ended before its descriptors were claimed");
  }
  auto content = registry_->Content(pending.entry);
  if (!content.ok()) {
    registry_->RemoveLease(pending.lease_id);
    return absl::UnavailableError("the model was evicted before its descriptors were claimed");
  }
  registry_->SetLeasePeer(pending.lease_id, peer.pid, static_cast<int>(peer.uid));
  HandleChannel::Grant g;
  g.lease_id = pending.lease_id;
  for (const auto& s : (*content)->segments) g.fds.push_back(s->fd());
  g.keepalive = *content;
  return g;
}

void LeaseManager::ExpireTokens() {
  std::vector<std::string> expired;
  {
    MutexLock l(mu_);
    auto now = std::chrono::steady_clock::now();
    for (auto it = tokens_.begin(); it != tokens_.end();) {
      if (it->second.expires <= now) {
        expired.push_back(it->second.lease_id);
        it = tokens_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (const auto& lease : expired) {
    WC_LOG_WARN("lease %s: token not claimed in time; lease ended", lease);
    registry_->RemoveLease(lease);
  }
}

bool LeaseManager::End(const std::string& lease_id) {
  {
    MutexLock l(mu_);
    for (auto it = tokens_.begin(); it != tokens_.end();) {
      it = it->second.lease_id == lease_id ? tokens_.erase(it) : std::next(it);
    }
  }
  return registry_->RemoveLease(lease_id);
}

absl::Status LeaseManager::Release(const Caller& caller, const std::string& lease_id) {
  if (const auto lease = registry_->FindLease(lease_id); lease && links_.authorize) {
    Object o;
    o.lease = lease_id;
    o.owner_unit = lease->owner_unit;
    o.owner_slot = lease->slot;
    WC_RETURN_IF_ERROR(links_.authorize(caller, Verb::kRelease, o));
  }
  if (!End(lease_id))
    return absl::NotFoundError(absl::StrCat("lease ", lease_id, " is not active"));
  if (links_.close) links_.close(lease_id);
  return absl::OkStatus();
}

}  // namespace weightcache::server
