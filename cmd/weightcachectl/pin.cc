#include "cmd/weightcachectl/pin.h"

#include <algorithm>
#include <map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace weightcache::ctl {

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
  // Per fingerprint this node holds ready, its segments' digests (issue 48): a peer fill of
  // that fingerprint is then served only with them (docs/peer-fill.md, "Anchors").
  std::map<std::string, const v1::EntryInfo*> held;
  for (const auto& e : status.entries()) {
    if (e.model() == model && e.state() == "ready" && !e.segment_sha256().empty()) {
      held.emplace(e.fingerprint(), &e);
    }
  }
  if (!held.empty()) {
    absl::StrAppend(&out,
                    "# Each segment's sha256-tree digest, per fingerprint (layout, dtype, GPU) "
                    "this node holds:\nsegment_digests:\n");
    for (const auto& [fp, e] : held) {
      absl::StrAppend(&out, "  ", fp, ":  # tp ", e->layout().tp_rank(), "/",
                      std::max(1u, e->layout().tp_size()), " on ",
                      e->device_uuid().empty() ? "host" : e->device_uuid(), "\n");
      for (const auto& d : e->segment_sha256()) absl::StrAppend(&out, "    - ", d, "\n");
    }
  }
  return out;
}

}  // namespace weightcache::ctl
