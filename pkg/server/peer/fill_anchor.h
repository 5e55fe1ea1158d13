// Which holders a peer fill may believe (issue 48, docs/peer-fill.md "Anchors"). A holder's
// record vouches for its own bytes only: a compromised node can answer Describe with a
// record whose segment digests are those of the altered bytes it serves, and the bytes then
// match. So a fill is served only when its segments' cryptographic digests match an anchor
// the source does not control:
//   pinned  the spec's `segment_digests` for the fingerprint (an admin's, from
//           `weightcachectl pin` on a node that loaded it);
//   quorum  the same digests in the records of at least `quorum` holders with distinct
//           identities whose copies came from disk or a pinned anchor (not from another
//           peer). An identity is the node a token the API server signed proves for this
//           call (--peer_identity=token, issue 57: pkg/nodeid), or, outside Kubernetes with
//           per-node certificates, the certificate's common name (certificate);
//   single  with --peer_trust=single, any one holder's own record (trusting every node
//           that holds the fleet's certificate, as before issue 48).
// With none, the fill does not happen: the disk loads the rank.
//
// Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace weightcache::server {

enum class PeerTrust { kQuorum, kSingle };
const char* PeerTrustName(PeerTrust t);
// "quorum" or "single"; INVALID_ARGUMENT naming the value and the choices otherwise.
absl::StatusOr<PeerTrust> ParsePeerTrust(const std::string& name);

// What a holder's identity is (issue 57): the node its token proves, or its certificate's name.
enum class PeerIdentity { kToken, kCertificate };
const char* PeerIdentityName(PeerIdentity i);
// "token", "certificate", or "auto": token where the pod's in-cluster credentials are
// (`in_cluster`), certificate elsewhere. INVALID_ARGUMENT naming --peer_identity otherwise.
absl::StatusOr<PeerIdentity> ParsePeerIdentity(const std::string& name, bool in_cluster);

// What one holder's answer says: who it is and its record's segment digests (32 raw bytes each).
struct HolderClaim {
  // The verified node (token) or certificate name; "" when there is none: then `unverified`
  // says why, and the holder counts toward no quorum.
  std::string identity;
  std::vector<std::string> segment_sha256;
  // How the holder's copy was first filled, as its record says (load::LoadedModel::origin).
  // Only a copy read from disk, or pulled against pinned digests, backs a quorum: a holder that
  // itself believed a peer vouches for nothing more than that peer did.
  std::string origin = "disk";
  std::string unverified;
};
// Whether a holder's copy of that origin may count toward a quorum.
bool OriginBacksAQuorum(const std::string& origin);

struct AnchorChoice {
  // "pinned", "quorum" or "single"; empty when there is no anchor (`none` says why).
  std::string anchor;
  std::vector<size_t> kept;  // indexes into the claims whose records match the anchor
  // The others, each with why it was left out.
  std::vector<std::pair<size_t, std::string>> refused;
  absl::Status none;  // FAILED_PRECONDITION naming what was missing, when `anchor` is empty
};

// `pinned`: the spec's segment digests for this fingerprint (32 raw bytes each; empty: none).
AnchorChoice ChooseAnchor(const std::vector<HolderClaim>& claims,
                          const std::vector<std::string>& pinned, PeerTrust trust,
                          size_t quorum = 2);

}  // namespace weightcache::server
