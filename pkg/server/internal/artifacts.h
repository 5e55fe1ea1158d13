// The daemon's side of compile artifacts (issue 29): the store (pkg/artifact), the one-time
// tokens that hand a stored artifact's sealed memfd out on the handle channel, and the wire
// conversions. Who may put, get or evict is decided by Daemon::Impl before it calls in
// (artifacts.cc). Not a public header.
//
// Thread-safety: every method may be called from any thread (gRPC threads issue, the handle
// channel's thread claims and expires).
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "pkg/artifact/store.h"
#include "pkg/server/wire/handle_channel.h"
#include "pkg/util/mutex.h"
#include "weightcache/v1/weightcache.pb.h"

namespace weightcache::server {

class ArtifactGrants {
 public:
  explicit ArtifactGrants(std::chrono::seconds token_ttl) : token_ttl_(token_ttl) {}
  // A token for `a`'s descriptor, claimable once on the handle socket of `slot`.
  std::string Issue(std::shared_ptr<const artifact::Artifact> a, const std::string& slot);
  bool IsToken(const std::string& token) const;
  // PERMISSION_DENIED on another slot's socket (the token stays claimable where it belongs).
  absl::StatusOr<HandleChannel::Grant> Claim(const std::string& token, const std::string& slot);
  // A handle connection closed: true when it was an artifact's (nothing to end).
  static bool IsGrant(const std::string& lease_id);
  void ExpireTokens();

 private:
  struct Pending {
    std::shared_ptr<const artifact::Artifact> artifact;
    std::string slot;
    std::chrono::steady_clock::time_point expires;
  };
  const std::chrono::seconds token_ttl_;
  mutable Mutex mu_;
  std::map<std::string, Pending> tokens_ ABSL_GUARDED_BY(mu_);
};

// Wire conversions.
artifact::Key KeyFromWire(const v1::ArtifactKey& k, const std::string& tenant);
void InfoToWire(const artifact::ArtifactInfo& i, v1::ArtifactInfo* out);

}  // namespace weightcache::server
