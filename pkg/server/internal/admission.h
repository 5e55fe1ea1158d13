// Placement and admission: the environment and layout a request asks for, the device a
// rank goes to, and starting loads (planned first, so the budget reserves the rank's own
// granule-rounded bytes) and peer copies in the registry. Not a public header.
//
// Thread-safety: every method may be called from any thread. Lifetimes: the options,
// backend, registry and staging pool passed in outlive the Admission.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "pkg/cache/registry.h"
#include "pkg/load/loader.h"
#include "pkg/load/model.h"
#include "pkg/load/staging_pool.h"
#include "pkg/memory/backend.h"
#include "pkg/server/options.h"
#include "pkg/server/peer/peer_fill.h"
#include "pkg/server/peer/rank_fill.h"
#include "weightcache/v1/weightcache.pb.h"

namespace weightcache::server {

class Admission {
 public:
  Admission(const DaemonOptions& options, memory::Backend* backend, cache::Registry& registry,
            load::StagingPool* staging_pool);

  // The fingerprint environment of a request and the device it names (env.device_uuid,
  // empty: none named). INVALID_ARGUMENT naming the UUID when the backend has no such
  // device; compute_capability defaults to that device's (else the first device's).
  struct AskedEnv {
    spec::Environment env;
    std::string device_uuid;
  };
  absl::StatusOr<AskedEnv> EnvFrom(const v1::Environment& env) const;
  // INVALID_ARGUMENT for ranks not below their sizes or sizes above 4096.
  absl::StatusOr<spec::Layout> LayoutFrom(const v1::Layout& layout) const;
  // Why loading `model` for `layout` in `env` on `device_uuid` (empty: the placement
  // rule's) is not a placement its spec declares: a layout other than its tp_size,
  // tp_ranks, pp_size and pp_rank; an environment other than the device's own (its compute
  // capability, this loader's format, no published-weights fields). Empty when declared.
  std::string UndeclaredPlacement(const spec::ModelSpec& model, const spec::Layout& layout,
                                  const spec::Environment& env,
                                  const std::string& device_uuid) const;
  // The environment of `rank` placed by the default rule (the compute capability of its
  // device) and that device.
  AskedEnv Placed(int rank) const;

  // The live entry of the model-rank on `device_uuid` (empty: the placement rule's), or a
  // new load of it: planned first; RESOURCE_EXHAUSTED when the device's budget cannot hold
  // the rank's planned bytes; the plan's error when it cannot be planned.
  absl::StatusOr<std::shared_ptr<cache::Entry>> StartLoad(
      const std::shared_ptr<const load::OpenedModel>& model, const spec::Layout& layout,
      const spec::Environment& env, const std::string& device_uuid);
  // Several ranks of one model (a tensor-parallel group), loaded together (GroupLoad:
  // load::LoadRanks reads each checkpoint byte once for all of them). Per rank, as
  // StartLoad: its live entry, the new entry, or the error that kept it from starting (the
  // other ranks still start). Ranks already live are joined, not loaded again.
  struct GroupRank {
    spec::Layout layout;
    spec::Environment env;
    std::string device_uuid;  // empty: the placement rule's
  };
  std::vector<absl::StatusOr<std::shared_ptr<cache::Entry>>> StartGroupLoad(
      const std::shared_ptr<const load::OpenedModel>& model, const std::vector<GroupRank>& ranks);
  // A new entry on `device_uuid` filled by copying ready entry `src` (another device) per
  // the peer policy; single-flight like a load, timed, counted with source "peer".
  absl::StatusOr<std::shared_ptr<cache::Entry>> StartPeerCopy(
      const std::shared_ptr<cache::Entry>& src, const std::string& device_uuid);

  // The live entry of `fingerprint` on `device_uuid`; with an empty device, the first
  // ready one on any device (else the first live one).
  std::shared_ptr<cache::Entry> FindOn(const std::string& fingerprint,
                                       const std::string& device_uuid) const;
  // A ready or loading entry of `fingerprint` on a device other than `device_uuid`.
  std::shared_ptr<cache::Entry> PeerSource(const std::string& fingerprint,
                                           const std::string& device_uuid) const;

  const std::string& default_compute_capability() const { return daemon_cc_; }

  // Peer fill (peer_fill.h): once set, a shared model-rank about to be read from disk is
  // first asked of the peers (a survey bounded by its describe deadline, on the caller's
  // thread); a rank some peer holds is filled from it (entry source "peer_fill"), from disk
  // when that fails (counted by reason). Set once, before loads start; null: off.
  void SetPeerFill(PeerFill* fill) { peer_fill_.store(fill); }

 private:
  // A rank planned for loading, or its live entry.
  struct Prepared {
    std::shared_ptr<cache::Entry> live;  // set: joined, nothing else is
    std::string fingerprint;
    std::string device;
    std::string label;
    load::Plan plan;
    cache::LoadRequest request;  // everything but the load function
  };
  absl::StatusOr<Prepared> Prepare(const std::shared_ptr<const load::OpenedModel>& model,
                                   const spec::Layout& layout, const spec::Environment& env,
                                   const std::string& device_uuid);
  load::LoadOptions LoadOptionsFor() const;
  // The disk load of a prepared rank (its request's load function).
  cache::LoadFn DiskLoad(const std::shared_ptr<const load::OpenedModel>& model,
                         const Prepared& p) const;
  // The peer fill of a prepared rank (rank_fill.h) when peer fill is on, the rank is shared
  // and some peer holds it (surveyed here, on the caller's thread); null otherwise (a miss is
  // counted as a fallback).
  std::shared_ptr<RankFill> SurveyPeers(const std::shared_ptr<const load::OpenedModel>& model,
                                        const Prepared& p) const;
  // Starts `p` as the entry `fill` loads (falling back to the disk in the same entry).
  absl::StatusOr<std::shared_ptr<cache::Entry>> StartFill(
      const std::shared_ptr<const load::OpenedModel>& model, Prepared p,
      const std::shared_ptr<RankFill>& fill);

  const DaemonOptions& options_;
  memory::Backend* const backend_;
  cache::Registry& registry_;
  load::StagingPool* const staging_pool_;
  std::string daemon_cc_;  // compute capability of the first device, or "cpu"
  std::atomic<PeerFill*> peer_fill_{nullptr};
};

}  // namespace weightcache::server
