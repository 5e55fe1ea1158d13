#include "pkg/server/peer/fill_anchor.h"

#include <algorithm>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"

namespace weightcache::server {

const char* PeerTrustName(PeerTrust t) { return t == PeerTrust::kSingle ? "single" : "quorum"; }

absl::StatusOr<PeerTrust> ParsePeerTrust(const std::string& name) {
  if (name == "quorum") return PeerTrust::kQuorum;
  if (name == "single") return PeerTrust::kSingle;
  return absl::InvalidArgumentError(
      absl::StrCat("--peer_trust: '", name, "' is neither 'quorum' nor 'single'"));
}

const char* PeerIdentityName(PeerIdentity i) {
  return i == PeerIdentity::kToken ? "token" : "certificate";
}

absl::StatusOr<PeerIdentity> ParsePeerIdentity(const std::string& name, bool in_cluster) {
  if (name == "token") return PeerIdentity::kToken;
  if (name == "certificate") return PeerIdentity::kCertificate;
  if (name == "auto") return in_cluster ? PeerIdentity::kToken : PeerIdentity::kCertificate;
  return absl::InvalidArgumentError(
      absl::StrCat("--peer_identity: '", name, "' is none of 'auto', 'token' and 'certificate'"));
}

bool OriginBacksAQuorum(const std::string& origin) {
  return origin == "disk" || origin == "peer_fill_pinned";
}

AnchorChoice ChooseAnchor(const std::vector<HolderClaim>& claims,
                          const std::vector<std::string>& pinned, PeerTrust trust, size_t quorum) {
  AnchorChoice c;
  if (!pinned.empty()) {
    c.anchor = "pinned";
    for (size_t i = 0; i < claims.size(); ++i) {
      if (claims[i].segment_sha256 == pinned) {
        c.kept.push_back(i);
      } else {
        c.refused.emplace_back(i, "its segment digests are not the spec's pinned ones");
      }
    }
    if (c.kept.empty()) {
      c.anchor.clear();
      c.none = absl::FailedPreconditionError(absl::StrCat(
          "no holder's segment digests are the spec's pinned ones (", claims.size(), " asked)"));
    }
    return c;
  }
  // The distinct identities behind each set of digests, of holders whose copies vouch.
  std::map<std::vector<std::string>, std::set<std::string>> backers;
  size_t laundered = 0;
  size_t unverified = 0;
  std::string why_unverified;
  for (const auto& h : claims) {
    if (h.identity.empty()) {
      if (unverified++ == 0) why_unverified = h.unverified;
      continue;
    }
    if (!OriginBacksAQuorum(h.origin)) {
      ++laundered;
      continue;
    }
    backers[h.segment_sha256].insert(h.identity);
  }
  const std::vector<std::string>* agreed = nullptr;
  size_t reaching = 0;
  size_t most = 0;
  for (const auto& [digests, ids] : backers) {
    most = std::max(most, ids.size());
    if (ids.size() >= quorum) {
      ++reaching;
      agreed = &digests;
    }
  }
  if (reaching == 1) {
    c.anchor = "quorum";
    for (size_t i = 0; i < claims.size(); ++i) {
      if (claims[i].segment_sha256 == *agreed) {
        c.kept.push_back(i);
      } else {
        c.refused.emplace_back(
            i, absl::StrCat("its record's segment digests differ from those ",
                            backers[*agreed].size(), " holders with distinct identities agree on"));
      }
    }
    return c;
  }
  if (reaching > 1) {
    c.none = absl::FailedPreconditionError(
        absl::StrCat(reaching, " sets of segment digests each have ", quorum,
                     " or more holders behind them: the fleet disagrees about these bytes"));
    return c;
  }
  if (trust == PeerTrust::kSingle && !claims.empty()) {
    c.anchor = "single";
    for (size_t i = 0; i < claims.size(); ++i) c.kept.push_back(i);
    return c;
  }
  c.none = absl::FailedPreconditionError(absl::StrCat(
      "no anchor for the holders' records: at most ", most,
      " holder(s) with distinct identities agree on the segment digests (", claims.size(),
      " answered",
      laundered > 0 ? absl::StrCat(", ", laundered, " not counted: filled from a peer") : "",
      unverified > 0 ? absl::StrCat(", ", unverified, " not counted: no verified identity (",
                                    why_unverified.empty() ? "none presented" : why_unverified, ")")
                     : "",
      "), ", quorum,
      " needed; pin the segment digests in the spec (weightcachectl pin) or accept one holder "
      "with --peer_trust=single"));
  return c;
}

}  // namespace weightcache::server
