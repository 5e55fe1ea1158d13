// The filling side of peer fill (issue 30, docs/peer-fill.md): a model-rank that would be
// read from disk is taken from other nodes' daemons that hold the same fingerprint ready.
// Find asks every peer (peer_set.h) to describe the fingerprint with a transfer; each record
// that decodes, names this fingerprint and places every tensor where this daemon's own plan
// does is a source. Fill allocates the rank's segments, pulls them over UCX
// (ucx_transfer.h) striped across the sources (one puller per source, segments handed out
// from one queue; a source that fails is dropped and its segment goes back to the others),
// seals each segment and checks its digest against the source's record before it counts.
// Anything that leaves a segment unfilled is an error naming the reason; the caller then
// loads the rank from disk (admission.cc) and counts the fallback.
//
// Thread-safety: Find and Fill may be called from several threads at once (each Fill uses
// its own pullers). Lifetimes: the backend, metrics and staging pool outlive the PeerFill.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "pkg/integrity/digest.h"
#include "pkg/load/loader.h"
#include "pkg/load/staging_pool.h"
#include "pkg/memory/backend.h"
#include "pkg/metrics/metrics.h"
#include "pkg/nodeid/node_identity.h"
#include "pkg/peer/peer_set.h"
#include "pkg/peer/ucx_transfer.h"
#include "pkg/server/keeper/keeper_record.h"
#include "pkg/server/peer/fill_anchor.h"
#include "weightcache/v1/peer.pb.h"

namespace weightcache::server {

// Why a fill fell back to disk: the `reason` label of weightcache_peer_fill_fallbacks_total.
enum class FillFallback {
  kNotHeld,   // no peer answered with the fingerprint (some may have failed: see the log)
  kRecord,    // a holder's record did not decode, named another fingerprint or placed
              // tensors otherwise than this daemon's plan
  kTransfer,  // every source failed a pull (gone, refused, token lapsed)
  kTimeout,   // a pull passed its deadline on every source left
  kDigest,    // a pulled segment differed from its source's record
  kMemory,    // this daemon could not allocate or seal the segments
  kAnchor,    // holders answered, but nothing vouches for their records (fill_anchor.h)
};
const char* FillFallbackName(FillFallback r);

struct PeerFillOptions {
  peer::PeerSetOptions peers;
  // Each segment is one pull (pull.timeout bounds it).
  peer::PullOptions pull;
  // Pulls into a GPU segment go through a host buffer of this many bytes per source: taken
  // from the daemon's pinned staging pool when there is one (a pageable buffer otherwise).
  uint64_t bounce_bytes = 64ull << 20;
  // Which holders' records may be believed without pinned segment digests (fill_anchor.h).
  PeerTrust trust = PeerTrust::kQuorum;
  // Set: a holder's identity is the node its token proves (pkg/nodeid; `peers.identify_as`
  // names this node, which the tokens must be made for). Null: its certificate's name.
  std::shared_ptr<nodeid::TokenVerifier> verifier;
};

// A holder that can serve the fill: its address, decoded record and transfer.
struct FillSource {
  std::string address;
  std::string node;        // its host name, from its answer
  std::string identity;    // its verified node (or certificate name; fill_anchor.h)
  std::string unverified;  // why `identity` is empty
  std::string anchor;      // what vouched for its record: "pinned", "quorum" or "single"
  AdoptableRecord record;
  v1::PeerTransfer transfer;
};

// The result of a failed Find or Fill: why (the metric's reason) and the status to log.
struct FillFailure {
  FillFallback reason;
  absl::Status status;
};

// What a fill did: segments filled from each source (in `sources` order), and the digests
// each segment matched.
struct FillReport {
  std::vector<size_t> segments_by_source;
  // Per segment, the cryptographic digest it was checked against (its source's record's);
  // empty for a segment not filled (`partial` says which were).
  std::vector<std::string> sha256;
  // Per segment, the digests taken of it when it was checked (this process's scrub digest
  // and the cryptographic one, as the registry's digester takes them); empty for a segment
  // not filled.
  std::vector<integrity::SegmentDigest> digests;
  // Set when the fill failed because every source was dropped after some segments were
  // filled: the rank with those segments (sealed, checked) and null in place of the others,
  // for the caller to load only the rest from disk (load::PlanSegments). Null after any
  // other failure, and after a success.
  std::unique_ptr<load::LoadedModel> partial;
};

class PeerFill {
 public:
  // `staging` (may be null: host backends) lends the pinned host buffers GPU segments are
  // filled through.
  PeerFill(PeerFillOptions options, memory::Backend* backend, metrics::Metrics* metrics,
           load::StagingPool* staging = nullptr);

  // The sources for `fingerprint` whose records agree with `plan` (this daemon's plan of the
  // rank on `device`'s backend), in the order the peers answered. Empty, with the failure
  // set, when there is none: kNotHeld, or kRecord when every holder's record was refused.
  // Only holders whose records match the anchor are sources (fill_anchor.h: `pinned`, the
  // spec's segment digests for this fingerprint, 32 raw bytes each, or empty); kAnchor when
  // there is none.
  std::vector<FillSource> Find(const std::string& fingerprint, const load::Plan& plan,
                               const std::vector<std::string>& pinned, FillFailure* failure);

  // Fills `plan` (of `model`, whose checkpoint is `model_dir`) on `device` from `sources`
  // (at least one), segments labelled "<label>/<i>", sealed and checked against the
  // records' digests; counted in the peer-fill metrics. While it runs, the sources'
  // exposures are renewed (a Describe with transfer every third of their hold). On failure
  // `failure` says why (CANCELLED when `progress` was cancelled: no fallback is due then)
  // and the segments are freed, except those filled before every source was dropped:
  // `report->partial` keeps them (their bytes are counted in the metrics then).
  absl::StatusOr<std::unique_ptr<load::LoadedModel>> Fill(
      const std::vector<FillSource>& sources, const load::Plan& plan, const std::string& model,
      const std::string& model_dir, const std::string& device, const std::string& label,
      load::LoadProgress* progress, FillFailure* failure, FillReport* report = nullptr);

  // Counts a fallback (the admission decides when one happened).
  void CountFallback(const std::string& model, FillFallback reason) const;

  const PeerFillOptions& options() const { return options_; }

 private:
  const PeerFillOptions options_;
  memory::Backend* const backend_;
  metrics::Metrics* const metrics_;
  load::StagingPool* const staging_;
  peer::PeerSet peers_;
};

// Where two plans of one fingerprint place a tensor differently (name, dtype, shape, segment,
// offset, size; segment sizes; views), as a sentence; empty when they agree. The filling
// daemon's own plan must be the source's for pulled bytes to be the tensors it serves.
std::string PlanDifference(const load::Plan& mine, const load::Plan& theirs);

}  // namespace weightcache::server
