// The serving side of peer fill (issue 30, docs/peer-fill.md): segments of ready entries
// exposed to other nodes' daemons for pulls over UCX (pkg/peer/ucx_transfer.h: copies of
// exposed bytes for requests naming a region's token). A Describe that asks for a transfer exposes
// every segment of the entry's content (mapped read-only, as engines map it) for a bounded
// hold, renewed by each such Describe; the exposure keeps the content alive meanwhile (an
// entry evicted during a pull is freed when its hold lapses), and a reaper thread unexposes
// what has lapsed. GPU segments are served through a device-to-host copy of each requested
// range into the reply (memory::CopyToHost; Debian's UCX has no CUDA).
//
// Thread-safety: Expose may be called from any thread (the peer API's handlers).
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "pkg/load/loader.h"
#include "pkg/memory/backend.h"
#include "pkg/memory/mapping.h"
#include "pkg/peer/ucx_transfer.h"
#include "pkg/util/mutex.h"
#include "weightcache/v1/peer.pb.h"

namespace weightcache::server {

class PeerExposures {
 public:
  using Clock = std::chrono::steady_clock;
  // `ucx` null: UCX did not start (`why` says why) and every Expose is UNAVAILABLE.
  PeerExposures(std::unique_ptr<peer::UcxServer> ucx, std::string why, memory::BackendKind kind,
                std::chrono::milliseconds hold);
  // Stops the reaper and unexposes everything (gets in flight fail on the peers' side).
  ~PeerExposures();
  PeerExposures(const PeerExposures&) = delete;
  PeerExposures& operator=(const PeerExposures&) = delete;

  // Exposes every segment of `content` until `hold` from now (an exposure of the same
  // content is renewed, not made twice) and describes the regions in `out`, in segment
  // order. UNAVAILABLE without UCX.
  absl::Status Expose(std::shared_ptr<const load::LoadedModel> content, v1::PeerTransfer* out);
  // Exposures held now (lapsed ones are gone within a reaper pass).
  size_t active() const;

 private:
  struct Exposure {
    std::shared_ptr<const load::LoadedModel> content;
    std::unique_ptr<memory::SegmentMapping> mapping;
    std::vector<peer::ExposedRegion> regions;
    Clock::time_point until;
  };
  absl::StatusOr<Exposure> Make(std::shared_ptr<const load::LoadedModel> content) const;
  void Unexpose(Exposure& e) const;
  void ReapLoop();

  const std::unique_ptr<peer::UcxServer> ucx_;
  const std::string why_;
  const memory::BackendKind kind_;
  const std::chrono::milliseconds hold_;
  mutable Mutex mu_;
  CondVar cv_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  // By content: an entry's content is one LoadedModel for its lifetime.
  std::map<const load::LoadedModel*, Exposure> exposures_ ABSL_GUARDED_BY(mu_);
  std::thread reaper_;
};

}  // namespace weightcache::server
