#include "cmd/weightcachectl/pin.h"

#include <algorithm>
#include <map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "pkg/util/status_macros.h"

namespace weightcache::ctl {
namespace {

// Why an entry of `source` vouches for nothing a pin could anchor.
std::string NotFromDisk(const std::string& source) {
  if (source == "peer_fill") {
    return "filled from other nodes' daemons (source peer_fill): its digests are what their "
           "records said";
  }
  if (source == "keeper") {
    return "adopted from the keeper after a restart (source keeper): how it was first filled "
           "is not known here";
  }
  if (source == "publish") return "published by an engine (source publish), not read from files";
  if (source == "peer") return "copied from another GPU of this node (source peer)";
  return absl::StrCat("filled from '", source, "', not from this node's files");
}

// The two parts of the block: each file's SHA-256, then each disk-loaded entry's segments.
absl::StatusOr<std::string> FileDigests(const v1::KnownModel& m, const std::string& model);
absl::StatusOr<std::string> SegmentDigests(const v1::StatusResponse& status,
                                           const std::string& model);

}  // namespace

absl::StatusOr<std::string> PinBlock(const v1::StatusResponse& status, const std::string& model) {
  const v1::KnownModel* m = nullptr;
  std::vector<std::string> known;
  for (const auto& k : status.models()) {
    known.push_back(k.name());
    if (k.name() == model) m = &k;
  }
  if (m == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("model '", model, "' is not known to the daemon (known: ",
                     known.empty() ? "none" : absl::StrJoin(known, ", "), ")"));
  }
  if (!m->refused().empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("model '", model, "' is refused by the daemon: ", m->refused()));
  }
  if (m->files().empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the daemon shows no content digests for model '", model,
        "': it has not opened it yet (weightcachectl load ", model,
        " does), or this socket is not an admin's (the digests are shown to admins only)"));
  }
  WC_ASSIGN_OR_RETURN(std::string out, FileDigests(*m, model));
  WC_ASSIGN_OR_RETURN(std::string segments, SegmentDigests(status, model));
  return out + segments;
}

namespace {

absl::StatusOr<std::string> FileDigests(const v1::KnownModel& km, const std::string& model) {
  const v1::KnownModel* m = &km;
  std::vector<const v1::CheckpointFile*> files;
  for (const auto& f : m->files()) files.push_back(&f);
  std::sort(files.begin(), files.end(),
            [](const auto* a, const auto* b) { return a->name() < b->name(); });
  std::string out = absl::StrCat("# weightcachectl pin ", model,
                                 ": each checkpoint file's SHA-256 as this node knows it.\n"
                                 "# Paste under the model's spec, or its entry in the chart's "
                                 "values (models:).\ndigests:\n");
  for (const auto* f : files) {
    const std::string prefix = "sha256:";
    if (f->digest().rfind(prefix, 0) != 0 || f->digest().size() != prefix.size() + 64) {
      return absl::FailedPreconditionError(
          absl::StrCat("model '", model, "': ", f->name(), " is known by ",
                       f->digest().empty() ? "no digest" : f->digest(),
                       ", not a SHA-256 of the file; a daemon of this version hashes it again "
                       "when it next opens the model"));
    }
    absl::StrAppend(
        &out, "  ", f->name(), ": ", f->digest().substr(prefix.size()),
        f->source() == "pinned" ? "  # the spec's own pin: not read on this node yet" : "", "\n");
  }
  return out;
}

absl::StatusOr<std::string> SegmentDigests(const v1::StatusResponse& status,
                                           const std::string& model) {
  std::string out;
  // Per fingerprint this node loaded from its own disk, its segments' digests (issue 48): a
  // peer fill of that fingerprint is then served only with them (docs/peer-fill.md,
  // "Anchors"). Only from disk: a peer-filled entry's digests are what its peers' records
  // said, and pinning them would make a forged copy the fleet's anchor (it launders it).
  std::map<std::string, const v1::EntryInfo*> held;
  std::vector<std::string> skipped;
  for (const auto& e : status.entries()) {
    if (e.model() != model || e.state() != "ready" || e.segment_sha256().empty()) continue;
    if (e.source() == "disk") {
      held.emplace(e.fingerprint(), &e);
    } else {
      skipped.push_back(absl::StrCat(e.fingerprint().substr(0, 12), " (tp ", e.layout().tp_rank(),
                                     "/", std::max(1u, e.layout().tp_size()),
                                     "): ", NotFromDisk(e.source())));
    }
  }
  if (held.empty() && !skipped.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "model '", model,
        "': no entry here was loaded from this node's disk, so there are no "
        "segment digests to pin: ",
        absl::StrJoin(skipped, "; "),
        ". Pin on a node that loaded it from its files (or evict it here and load it with "
        "peer fill off), where its digests are what those files hold"));
  }
  if (!held.empty()) {
    absl::StrAppend(&out,
                    "# Each segment's sha256-tree digest, per fingerprint (layout, dtype, GPU) "
                    "this node loaded from its own disk\n# (its files read and hashed here; "
                    "entries filled otherwise are left out):\nsegment_digests:\n");
    for (const auto& [fp, e] : held) {
      absl::StrAppend(&out, "  ", fp, ":  # tp ", e->layout().tp_rank(), "/",
                      std::max(1u, e->layout().tp_size()), " on ",
                      e->device_uuid().empty() ? "host" : e->device_uuid(), "\n");
      for (const auto& d : e->segment_sha256()) absl::StrAppend(&out, "    - ", d, "\n");
    }
  }
  for (const auto& why : skipped) absl::StrAppend(&out, "# left out: ", why, "\n");
  return out;
}

}  // namespace

}  // namespace weightcache::ctl
