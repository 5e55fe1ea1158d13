// RankFill (rank_fill.h): one peer fill of one model-rank, survey to end.
#include "pkg/server/peer/rank_fill.h"

#include "absl/strings/str_cat.h"
#include "pkg/util/log.h"
#include "pkg/util/status_macros.h"

namespace weightcache::server {

const char* RankFill::StageName(Stage s) {
  switch (s) {
    case Stage::kPull:
      return "pull";
    case Stage::kFilled:
      return "filled";
    case Stage::kRest:
      return "rest";
    case Stage::kDisk:
      return "disk";
    case Stage::kFailed:
      return "failed";
  }
  return "unknown";
}

std::shared_ptr<RankFill> RankFill::Survey(PeerFill& fill, Rank rank, DiskLoad disk) {
  FillFailure why{FillFallback::kNotHeld, absl::OkStatus()};
  auto sources = fill.Find(rank.fingerprint, rank.plan, rank.pinned, &why);
  if (sources.empty()) {
    fill.CountFallback(rank.model, why.reason);
    WC_LOG_INFO("peer fill of %s rank %d: %s; loading from disk", rank.model, rank.tp_rank,
                std::string(why.status.message()));
    return nullptr;
  }
  return std::shared_ptr<RankFill>(
      new RankFill(fill, std::move(rank), std::move(disk), std::move(sources)));
}

std::string RankFill::Origin() const {
  for (const auto& s : sources_) {
    if (s.anchor != "pinned") return "peer_fill";
  }
  return "peer_fill_pinned";
}

absl::StatusOr<std::unique_ptr<load::LoadedModel>> RankFill::Run(load::LoadProgress& progress) {
  FillFailure why{FillFallback::kTransfer, absl::OkStatus()};
  FillReport report;
  auto filled = fill_.Fill(sources_, rank_.plan, rank_.model, rank_.model_dir, rank_.device,
                           rank_.label, &progress, &why, &report);
  verified_ = report.sha256;
  if (filled.ok()) {
    taken_ = std::move(report.digests);
    stage_ = Stage::kFilled;
    (*filled)->origin = Origin();
    return filled;
  }
  if (progress.cancelled()) {
    stage_ = Stage::kFailed;
    return filled.status();
  }
  fill_.CountFallback(rank_.model, why.reason);
  progress.SetDone(0);
  const std::string fp = rank_.fingerprint.substr(0, 12);
  if (report.partial == nullptr) {
    verified_.clear();
    stage_ = Stage::kDisk;
    WC_LOG_WARN("peer fill of %s (%s on %s) fell back to disk (%s): %s", rank_.model, fp,
                rank_.device, FillFallbackName(why.reason), std::string(filled.status().message()));
    auto loaded = disk_(rank_.plan, &progress);
    if (!loaded.ok()) stage_ = Stage::kFailed;
    return loaded;
  }
  size_t missing = 0;
  for (const auto& s : report.partial->segments) missing += s == nullptr ? 1 : 0;
  WC_LOG_WARN("peer fill of %s (%s on %s) fell back to disk (%s) for %d of %d segments: %s",
              rank_.model, fp, rank_.device, FillFallbackName(why.reason),
              static_cast<int>(missing), static_cast<int>(report.partial->segments.size()),
              std::string(filled.status().message()));
  stage_ = Stage::kRest;
  auto loaded = LoadRest(std::move(report.partial), progress);
  if (!loaded.ok()) {
    stage_ = Stage::kFailed;
  } else {
    (*loaded)->origin = Origin();  // part of it came from a peer: vouched for as that part was
  }
  return loaded;
}

// A filled segment that the part had to take as well (a quantized weight's scale elsewhere)
// is read again; only the segments still from peers keep their checked digests.
absl::StatusOr<std::unique_ptr<load::LoadedModel>> RankFill::LoadRest(
    std::unique_ptr<load::LoadedModel> partial, load::LoadProgress& progress) {
  std::vector<bool> missing(partial->segments.size());
  for (size_t i = 0; i < missing.size(); ++i) missing[i] = partial->segments[i] == nullptr;
  load::PlanPart part = load::PlanSegments(partial->plan, std::move(missing));
  WC_ASSIGN_OR_RETURN(auto rest, disk_(std::move(part.plan), &progress));
  for (size_t j = 0; j < part.segments.size(); ++j) {
    const uint32_t i = part.segments[j];
    partial->segments[i] = std::move(rest->segments[j]);
    verified_[i].clear();
  }
  partial->stats = rest->stats;
  return partial;
}

std::vector<integrity::SegmentDigest> RankFill::TakenDigests() const {
  if (stage_ != Stage::kFilled) return {};
  for (const auto& d : taken_) {
    if (d.chunks.empty()) return {};  // a segment not checked here: the registry digests all
  }
  return taken_;
}

absl::Status RankFill::CheckDigests(const std::vector<integrity::SegmentDigest>& got) const {
  // After a whole fallback, the disk's bytes are their own truth.
  if (verified_.empty()) return absl::OkStatus();
  if (got.size() != verified_.size()) {
    return absl::DataLossError(absl::StrCat("peer fill: ", got.size(), " digests for ",
                                            verified_.size(), " filled segments"));
  }
  for (size_t i = 0; i < got.size(); ++i) {
    if (!verified_[i].empty() && got[i].sha256 != verified_[i]) {
      return absl::DataLossError(absl::StrCat("peer fill: segment ", i,
                                              " changed between its check and the entry's digest"));
    }
  }
  return absl::OkStatus();
}

}  // namespace weightcache::server
