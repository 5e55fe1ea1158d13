// PeerFill::Find (peer_fill.h): the survey of the peers, the checks of each holder's record
// (decodes, names the fingerprint, this backend, this daemon's placement) and the anchor that
// decides which records may be believed (fill_anchor.h); PlanDifference.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "pkg/server/peer/peer_fill.h"
#include "pkg/util/log.h"

namespace weightcache::server {

namespace {

// The sources whose records match the anchor (fill_anchor.h); the others join `refused`.
// None: `failure` says kAnchor and why.
std::vector<FillSource> Anchored(std::vector<FillSource> in, const std::vector<std::string>& pinned,
                                 PeerTrust trust, const std::string& fingerprint,
                                 std::vector<std::string>* refused, FillFailure* failure) {
  std::vector<HolderClaim> claims;
  claims.reserve(in.size());
  for (const auto& s : in) {
    const auto& d = s.record.record.segment_sha256();
    claims.push_back({s.identity, std::vector<std::string>(d.begin(), d.end()),
                      s.record.record.source(), s.unverified});
  }
  AnchorChoice c = ChooseAnchor(claims, pinned, trust);
  for (const auto& [i, why] : c.refused) {
    refused->push_back(absl::StrCat(in[i].address, " (", in[i].identity, "): ", why));
    WC_LOG_WARN("peer fill: the record of %s from %s (%s) refused: %s", fingerprint.substr(0, 12),
                in[i].address, in[i].identity, why);
  }
  std::vector<FillSource> out;
  for (size_t i : c.kept) {
    out.push_back(std::move(in[i]));
    out.back().anchor = c.anchor;
  }
  if (out.empty() && failure != nullptr) {
    std::string why(c.none.ok() ? "no holder matches the anchor" : c.none.message());
    if (!refused->empty()) absl::StrAppend(&why, " (", absl::StrJoin(*refused, "; "), ")");
    *failure = {FillFallback::kAnchor, absl::FailedPreconditionError(why)};
  }
  return out;
}

// The node `h`'s token proves, for this node's call and this answer's record; "" with `why`
// set when it proves none.
std::string VerifiedNode(nodeid::TokenVerifier& verifier, const std::string& self_node,
                         const peer::PeerHolder& h, std::string* why) {
  const std::string& token = h.response.node_token();
  if (token.empty()) {
    *why = "it presented no node token";
    return "";
  }
  const std::string audience =
      nodeid::PeerAudience(self_node, h.nonce, nodeid::ClaimOf(h.response.record()));
  auto v = verifier.Verify(token, audience);
  if (!v.ok()) {
    *why = std::string(v.status().message());
    return "";
  }
  return v->node;
}

std::string DescribeTensorPlacement(const load::PlannedTensor& t) {
  std::string out(safetensors::DTypeName(t.dtype));
  absl::StrAppend(&out, "[", absl::StrJoin(t.shape, ","), "] at segment ", t.segment);
  absl::StrAppend(&out, " offset ", t.offset, ", ", t.nbytes, " bytes");
  return out;
}

std::string TensorsDifference(const char* what, const std::vector<load::PlannedTensor>& mine,
                              const std::vector<load::PlannedTensor>& theirs) {
  if (mine.size() != theirs.size()) {
    return absl::StrCat(mine.size(), " ", what, " here, ", theirs.size(), " at the source");
  }
  for (size_t i = 0; i < mine.size(); ++i) {
    const auto& a = mine[i];
    const auto& b = theirs[i];
    if (a.name != b.name) {
      return absl::StrCat(what, " ", i, " is '", a.name, "' here, '", b.name, "' at the source");
    }
    if (a.dtype != b.dtype || a.shape != b.shape || a.segment != b.segment ||
        a.offset != b.offset || a.nbytes != b.nbytes || a.strides != b.strides) {
      return absl::StrCat("'", a.name, "' is ", DescribeTensorPlacement(a), " here, ",
                          DescribeTensorPlacement(b), " at the source");
    }
  }
  return "";
}

}  // namespace

std::string PlanDifference(const load::Plan& mine, const load::Plan& theirs) {
  if (mine.segment_bytes != theirs.segment_bytes) {
    return absl::StrCat("segments of [", absl::StrJoin(mine.segment_bytes, ", "), "] bytes here, [",
                        absl::StrJoin(theirs.segment_bytes, ", "), "] at the source");
  }
  if (mine.total_bytes != theirs.total_bytes) {
    return absl::StrCat(mine.total_bytes, " tensor bytes here, ", theirs.total_bytes,
                        " at the source");
  }
  if (auto d = TensorsDifference("tensors", mine.tensors, theirs.tensors); !d.empty()) return d;
  return TensorsDifference("views", mine.views, theirs.views);
}

std::vector<FillSource> PeerFill::Find(const std::string& fingerprint, const load::Plan& plan,
                                       const std::vector<std::string>& pinned,
                                       FillFailure* failure) {
  peer::PeerSurvey survey = peers_.Survey(fingerprint, /*transfer=*/true);
  for (const auto& f : survey.failures) {
    WC_LOG_INFO("peer fill: %s not asked about %s: %s", f.address, fingerprint.substr(0, 12),
                std::string(f.status.message()));
  }
  std::vector<FillSource> out;
  std::vector<std::string> refused;
  const std::string self_node = options_.peers.identify_as;
  const std::string backend = memory::BackendName(backend_->kind());
  for (auto& h : survey.holders) {
    auto refuse = [&](const std::string& why) {
      refused.push_back(absl::StrCat(h.address, ": ", why));
      WC_LOG_WARN("peer fill: the record of %s from %s refused: %s", fingerprint.substr(0, 12),
                  h.address, why);
    };
    auto a = DecodeKeeperRecord(h.response.record());
    if (!a.ok()) {
      refuse(std::string(a.status().message()));
      continue;
    }
    const v1::KeeperRecord& r = a->record;
    if (r.fingerprint() != fingerprint) {
      refuse(absl::StrCat("it is the record of fingerprint ", r.fingerprint().substr(0, 12)));
      continue;
    }
    if (r.backend() != backend) {
      refuse(absl::StrCat("its copy is in ", r.backend(), " memory; this daemon runs ", backend));
      continue;
    }
    if (auto d = PlanDifference(plan, a->plan); !d.empty()) {
      refuse(absl::StrCat("its tensors are placed otherwise: ", d));
      continue;
    }
    // DecodeKeeperRecord refused a record without a cryptographic digest per segment.
    const int segments = static_cast<int>(plan.segment_bytes.size());
    const v1::PeerTransfer& t = h.response.transfer();
    if (t.worker_address().empty() || t.regions_size() != segments) {
      refuse(absl::StrCat("its answer offers ", t.regions_size(), " regions for ", segments,
                          " segments"));
      continue;
    }
    FillSource s;
    s.address = h.address;
    s.node = h.response.node();
    if (options_.verifier == nullptr) {
      s.identity = h.identity;
    } else {
      s.identity = VerifiedNode(*options_.verifier, self_node, h, &s.unverified);
      if (s.identity.empty()) {
        WC_LOG_WARN("peer fill: %s counts toward no quorum for %s: %s", h.address,
                    fingerprint.substr(0, 12), s.unverified);
      }
    }
    s.record = *std::move(a);
    s.transfer = t;
    out.push_back(std::move(s));
  }
  bool unanchored = false;
  if (!out.empty()) {
    out = Anchored(std::move(out), pinned, options_.trust, fingerprint, &refused, failure);
    unanchored = out.empty();
  }
  if (out.empty() && failure != nullptr && !unanchored) {
    if (!refused.empty()) {
      *failure = {FillFallback::kRecord,
                  absl::FailedPreconditionError(absl::StrCat("every holder's record was refused: ",
                                                             absl::StrJoin(refused, "; ")))};
    } else {
      *failure = {FillFallback::kNotHeld,
                  absl::NotFoundError(absl::StrCat("no peer holds ", fingerprint.substr(0, 12),
                                                   " (", survey.asked(), " asked, ",
                                                   survey.failures.size(), " did not answer)"))};
    }
  }
  return out;
}

}  // namespace weightcache::server
