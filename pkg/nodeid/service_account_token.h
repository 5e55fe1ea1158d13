// A node's identity as the API server signs it (issue 57, node_identity.h): the presenting
// side asks TokenRequest for a token bound to its own pod and made for one audience; the
// receiving side checks such a token against the issuer's published keys (the API server's
// /openid/v1/jwks, its issuer from /.well-known/openid-configuration), both with the pod's own
// in-cluster credentials (kube_api.h). No TokenReview: the keys are cached, so a quorum of N
// holders costs the API server N TokenRequests, not N more reviews.
//
// Thread-safety: Token and Verify may be called from several threads at once. Each holds its
// KubeApi.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "pkg/nodeid/jwt.h"
#include "pkg/nodeid/kube_api.h"
#include "pkg/nodeid/node_identity.h"
#include "pkg/util/mutex.h"

namespace weightcache::nodeid {

// The API server's minimum lifetime for a requested token: 10 minutes.
inline constexpr int64_t kTokenSeconds = 600;

struct PodRef {
  std::string name, uid;  // the Downward API's metadata.name and metadata.uid
};

// Asks POST /api/v1/namespaces/{ns}/serviceaccounts/{sa}/token for a token of this pod's own
// service account, bound to `pod` (the API server then puts the pod and its node in it, and
// revokes it with the pod), for the one audience asked.
class ApiTokenSource final : public TokenSource {
 public:
  // INVALID_ARGUMENT naming the field when the pod's name or uid is empty.
  static absl::StatusOr<std::unique_ptr<ApiTokenSource>> Make(std::shared_ptr<const KubeApi> api,
                                                              PodRef pod);
  absl::StatusOr<std::string> Token(const std::string& audience) override;

 private:
  ApiTokenSource(std::shared_ptr<const KubeApi> api, PodRef pod)
      : api_(std::move(api)), pod_(std::move(pod)) {}
  const std::shared_ptr<const KubeApi> api_;
  const PodRef pod_;
};

struct VerifierOptions {
  // The service account every peer daemon runs as: this daemon's own (KubeApi), so a token
  // of any other workload of the cluster proves nothing here.
  std::string namespace_name, service_account;
  // Clock skew allowed on exp, nbf and iat.
  std::chrono::seconds skew{60};
  // An unknown kid refetches the keys, at most this often (the issuer rotates rarely; a
  // peer sending made-up kids must not turn into a flood on the API server).
  std::chrono::seconds refetch_interval{10};
  std::function<std::chrono::system_clock::time_point()> now = std::chrono::system_clock::now;
};

class ApiTokenVerifier final : public TokenVerifier {
 public:
  static absl::StatusOr<std::unique_ptr<ApiTokenVerifier>> Make(std::shared_ptr<const KubeApi> api,
                                                                VerifierOptions o);
  absl::StatusOr<VerifiedNode> Verify(const std::string& token,
                                      const std::string& audience) override;

 private:
  ApiTokenVerifier(std::shared_ptr<const KubeApi> api, VerifierOptions o)
      : api_(std::move(api)), options_(std::move(o)) {}
  // The key named `kid`, fetching the issuer's document and keys when not known yet (and the
  // last fetch is older than refetch_interval). Sets `issuer`.
  absl::StatusOr<PublicKey> KeyFor(const std::string& kid, std::string* issuer);
  absl::Status FetchLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::shared_ptr<const KubeApi> api_;
  const VerifierOptions options_;
  Mutex mu_;
  std::string issuer_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, PublicKey> keys_ ABSL_GUARDED_BY(mu_);
  std::chrono::steady_clock::time_point fetched_ ABSL_GUARDED_BY(mu_){};
  bool ever_fetched_ ABSL_GUARDED_BY(mu_) = false;
};

// The checks of a token's claims, apart from its signature (which ApiTokenVerifier makes with
// the issuer's key first): iss, aud, exp/nbf/iat, sub and the kubernetes.io claim.
absl::StatusOr<VerifiedNode> CheckClaims(const nlohmann::json& claims, const std::string& issuer,
                                         const std::string& audience, const VerifierOptions& o);

}  // namespace weightcache::nodeid
