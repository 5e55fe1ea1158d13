// Who a node's daemon is (issue 57, docs/security.md "Across nodes"): the vocabulary that the
// presenter of a token (the peer API, answering a Describe), its verifier (a filling daemon
// counting holders towards a quorum) and the API-server code share. Depends on nothing else of
// weightcache.
//
// A node is what a token the Kubernetes API server signed says: the daemon's pod asks the API
// server (TokenRequest) for a token bound to its own pod, whose claims name that pod and the
// node it runs on. A token is a bearer credential, so it is made for ONE receiver and ONE
// answer: its audience (PeerAudience) names the receiving daemon's node, a fresh nonce that
// receiver chose for this one call, and the SHA-256 of the answer the token vouches for. A
// receiver that forwards a token to a third daemon gets nothing: the third expects its own
// node and its own nonce; a relay that swaps the answer under a genuine token breaks the claim.
//
// Thread-safety: the free functions are pure. A TokenSource or TokenVerifier may be called from
// several threads at once (the implementations say so).
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace weightcache::nodeid {

// What a verified token says about its presenter.
struct VerifiedNode {
  std::string node;      // the node's name: the identity a quorum counts
  std::string node_uid;  // "" when the API server put none (no node claim: refused)
  std::string pod, pod_uid;
  std::string namespace_name, service_account;
};

inline constexpr char kAudiencePrefix[] = "weightcache.io/peer/";

// "weightcache.io/peer/<receiver_node>/<nonce>/<claim>": what a token for one answer to one
// call is made for. `claim` is the lower-case hex SHA-256 of the answer's bytes (ClaimOf).
std::string PeerAudience(const std::string& receiver_node, const std::string& nonce,
                         const std::string& claim);
// Lower-case hex SHA-256 of `answer`.
std::string ClaimOf(const std::string& answer);

// A fresh nonce: 16 random bytes as 32 hex digits.
std::string NewNonce();

// INVALID_ARGUMENT naming `what` unless `name` is a DNS subdomain (what Kubernetes allows as a
// node name): 1..253 characters of [a-z0-9.-].
absl::Status CheckNodeName(const std::string& name, const std::string& what);
// INVALID_ARGUMENT naming `what` unless `nonce` is 32..128 hex digits.
absl::Status CheckNonce(const std::string& nonce, const std::string& what);

// The presenting side: a token the API server signs for this daemon's pod, for `audience`.
class TokenSource {
 public:
  virtual ~TokenSource() = default;
  virtual absl::StatusOr<std::string> Token(const std::string& audience) = 0;
};

// The receiving side: the node a token proves, when it is valid for exactly `audience`;
// PERMISSION_DENIED (or UNAVAILABLE when the issuer's keys cannot be fetched) naming why not.
class TokenVerifier {
 public:
  virtual ~TokenVerifier() = default;
  virtual absl::StatusOr<VerifiedNode> Verify(const std::string& token,
                                              const std::string& audience) = 0;
};

}  // namespace weightcache::nodeid
