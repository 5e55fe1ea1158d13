// Leases and their one-time tokens: an Acquire records a lease on the entry it serves and
// issues a token; the client presents the token on the handle channel and receives the
// entry's descriptors (Claim). Both bind to the entry itself, never to its key: after an
// evict and a reload under the same key, an old token cannot claim the new entry.
// Not a public header.
//
// Thread-safety: every method may be called from any thread (gRPC threads issue and end
// leases; the handle channel's thread claims and expires tokens).
// Lifetimes: the registry outlives the LeaseManager; the links are called only from Release
// (an RPC), so what they reach must exist while RPCs are served.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "pkg/cache/registry.h"
#include "pkg/server/policy/policy.h"
#include "pkg/server/wire/caller.h"
#include "pkg/server/wire/handle_channel.h"
#include "pkg/util/mutex.h"

namespace weightcache::server {

// What an Acquire ends in (LeaseManager implements it): a lease on the entry it serves and
// the one-time token for its descriptors.
class LeaseIssuer {
 public:
  struct Issued {
    std::string lease_id;
    std::string token;
    std::shared_ptr<const load::LoadedModel> content;  // what the token will hand out
  };
  virtual ~LeaseIssuer() = default;
  // Records a lease on ready entry `e` and a token for its descriptors. UNAVAILABLE naming
  // `name` when `e` is no longer ready (evicted between the caller's lookup and now): then
  // there is neither a lease nor a token. `before_lease` (tests) runs just before the lease
  // is recorded.
  // `owner` (the acquiring peer: its credentials and tenant unit; the unit may release the
  // lease) is recorded with its pid until the claim names the process that holds the
  // descriptors. `slot`: the slot socket the Acquire
  // came in on (empty: the shared one); the token is claimable on that slot's handle socket
  // only.
  virtual absl::StatusOr<Issued> Issue(
      const std::shared_ptr<cache::Entry>& e, const std::string& name, const Caller& owner,
      const std::function<void(const std::string&)>& before_lease) = 0;
};

class LeaseManager final : public LeaseIssuer {
 public:
  // What Release reaches outside the leases: the door's rule (Access::Authorize) and the
  // handle channel, whose connection of the lease is closed once it ends. Null: every caller
  // may release, nothing to close (unit tests that never release).
  struct Links {
    std::function<absl::Status(const Caller&, Verb, const Object&)> authorize;
    std::function<void(const std::string& lease_id)> close;
  };
  LeaseManager(cache::Registry* registry, std::chrono::seconds token_ttl, Links links = {})
      : registry_(registry), token_ttl_(token_ttl), links_(std::move(links)) {}

  absl::StatusOr<Issued> Issue(
      const std::shared_ptr<cache::Entry>& e, const std::string& name, const Caller& owner,
      const std::function<void(const std::string&)>& before_lease) override;
  // The handle channel's claim: the token's own entry's descriptors, once. PERMISSION_DENIED
  // (the token stays claimable where it belongs) when `slot` is not the token's.
  absl::StatusOr<HandleChannel::Grant> Claim(const std::string& token, const PeerCred& peer,
                                             const std::string& slot);
  // Ends the leases whose tokens were not claimed in time (called on the channel's tick).
  void ExpireTokens();
  // Ends a lease (and its token if unclaimed); false when no such lease is active.
  bool End(const std::string& lease_id);
  // The Release RPC: `caller` ends lease `lease_id` when the release rule lets it (the lease's
  // owner unit and slot, or an admin; PERMISSION_DENIED naming the rule otherwise); the
  // lease's handle connection is closed. NOT_FOUND when no such lease is active.
  absl::Status Release(const Caller& caller, const std::string& lease_id);

 private:
  struct PendingToken {
    std::string lease_id;
    std::shared_ptr<cache::Entry> entry;
    std::chrono::steady_clock::time_point expires;
    std::string slot;
  };

  cache::Registry* const registry_;
  const std::chrono::seconds token_ttl_;
  const Links links_;
  Mutex mu_;
  std::map<std::string, PendingToken> tokens_ ABSL_GUARDED_BY(mu_);
};

}  // namespace weightcache::server
