// One peer fill of one model-rank (docs/architecture.md, "A peer fill's life"): the object
// that carries it from the survey to its end and owns everything it learns on the way.
//
//   Survey ──(no peer holds it, or no record is anchored: counted, disk)──► null
//     │ the anchored sources (PeerFill::Find: survey, record checks, fill_anchor.h)
//     ▼
//   Pull ─► Check  every segment pulled from a source, sealed, digested against its record
//     │       (PeerFill::Fill: one puller per source; a source that fails is dropped)
//     ├─ all filled ───────────────────────────────► Filled
//     ├─ some filled, every source dropped ─► Rest ─► the missing segments from disk
//     └─ none filled ────────────────────────────────► Disk: the whole rank from disk
//   then the registry digests what Run returned, and CheckDigests holds each segment that
//   came from a peer to the digest it was checked against while filling.
//
// Admission makes it (Survey, on the caller's thread) and hands Run and CheckDigests to the
// registry as the entry's load and digest check; it supplies the disk load, nothing else.
//
// Thread-safety: Survey on any thread; Run then CheckDigests on the registry's load thread,
// in that order, once each; stage() from any thread. Lifetimes: the PeerFill outlives every
// RankFill (the daemon declares it before the registry, which joins the load threads).
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "pkg/integrity/digest.h"
#include "pkg/load/loader.h"
#include "pkg/load/plan.h"
#include "pkg/server/peer/peer_fill.h"

namespace weightcache::server {

class RankFill {
 public:
  enum class Stage {
    kPull,    // surveyed, sources anchored; Run not yet done
    kFilled,  // every segment from peers
    kRest,    // some segments from peers, the rest from disk
    kDisk,    // the whole rank from disk after the pulls failed
    kFailed,  // cancelled, or the disk's load failed too
  };
  static const char* StageName(Stage s);

  // The rank to fill: its model (spec name and checkpoint), fingerprint, tensor-parallel rank
  // (for the log), the device and segment label, this daemon's plan of it, and the spec's
  // pinned segment digests for the fingerprint (raw bytes; empty: none pinned).
  struct Rank {
    std::string model;
    std::string model_dir;
    std::string fingerprint;
    int tp_rank = 0;
    std::string device;
    std::string label;
    load::Plan plan;
    std::vector<std::string> pinned;
  };
  // Loads `plan` from disk (the whole rank's, or the part a partial fill lacks: its
  // segments in the part's order), reporting to `progress`.
  using DiskLoad = std::function<absl::StatusOr<std::unique_ptr<load::LoadedModel>>(
      load::Plan plan, load::LoadProgress* progress)>;

  // Survey and anchor (bounded by the peers' describe deadline): the fill when some peer
  // holds the rank with an anchored record; null when none does (the fallback is counted and
  // logged, and the caller loads from disk).
  static std::shared_ptr<RankFill> Survey(PeerFill& fill, Rank rank, DiskLoad disk);

  // Pull, check and, after a failure, fill the rest (or all) from disk: the entry's load.
  // CANCELLED when `progress` was cancelled (no fallback then).
  absl::StatusOr<std::unique_ptr<load::LoadedModel>> Run(load::LoadProgress& progress);
  // The entry's digest check: each segment that came from a peer has the digest it was
  // checked against while filling (the same sealed memory); DATA_LOSS naming it otherwise.
  absl::Status CheckDigests(const std::vector<integrity::SegmentDigest>& got) const;
  // The entry's digests when every segment came from peers: those each segment's check took
  // (cache::LoadRequest::taken_digests), so the fill is digested once; empty otherwise (the
  // registry digests the rank). After Run, on its thread.
  std::vector<integrity::SegmentDigest> TakenDigests() const;

  Stage stage() const { return stage_.load(); }
  const std::vector<FillSource>& sources() const { return sources_; }

 private:
  // The filled copy's origin (load::LoadedModel::origin): "peer_fill_pinned" when every source
  // was anchored by the spec's pinned digests, "peer_fill" otherwise.
  std::string Origin() const;
  RankFill(PeerFill& fill, Rank rank, DiskLoad disk, std::vector<FillSource> sources)
      : fill_(fill), rank_(std::move(rank)), disk_(std::move(disk)), sources_(std::move(sources)) {}
  // The segments a partial fill lacks, from disk, put in their places.
  absl::StatusOr<std::unique_ptr<load::LoadedModel>> LoadRest(
      std::unique_ptr<load::LoadedModel> partial, load::LoadProgress& progress);

  PeerFill& fill_;
  const Rank rank_;
  const DiskLoad disk_;
  const std::vector<FillSource> sources_;
  // Per segment: the cryptographic digest it was checked against when it came from a peer,
  // empty when it came from disk (empty vector: no segment came from a peer). Written by Run,
  // read by CheckDigests after it, on the same thread.
  std::vector<std::string> verified_;
  std::vector<integrity::SegmentDigest> taken_;  // Run's, when every segment was filled
  std::atomic<Stage> stage_{Stage::kPull};
};

}  // namespace weightcache::server
