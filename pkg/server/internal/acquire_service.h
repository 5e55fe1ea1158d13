// Acquire: the whole policy of serving a model-rank to an engine — the stale check against
// the files on disk, a hit, a peer copy from another device of the node, a load on a miss
// (placement checked by the policy), and the diagnosis of a miss or a mismatch field by
// field — and the lease it ends in. Counts each answer by result. Not a public header.
//
// Thread-safety: every method may be called from any thread (gRPC's). Lifetimes: everything
// passed to the constructor outlives the service.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "pkg/cache/registry.h"
#include "pkg/memory/backend.h"
#include "pkg/metrics/metrics.h"
#include "pkg/server/internal/access.h"
#include "pkg/server/internal/admission.h"
#include "pkg/server/internal/lease_manager.h"
#include "pkg/server/internal/model_catalog.h"
#include "pkg/server/internal/preloads.h"
#include "pkg/server/messages/manifest.h"
#include "pkg/server/options.h"
#include "weightcache/v1/weightcache.pb.h"

namespace weightcache::server {

class AcquireService {
 public:
  struct Options {
    std::chrono::seconds acquire_wait{600};  // wait_ready / load_on_miss bound
    PeerPolicy peer_policy = PeerPolicy::kCopy;
    memory::BackendKind backend = memory::BackendKind::kHost;  // named in answers
    std::string handle_socket;       // named in answers on the shared socket
    std::string slot_handle_socket;  // on a slot socket: the slot's, as its engines see it
    // Tests only (DaemonHooks::BeforeLease): between finding a ready entry and its lease.
    std::function<void(const std::string& model)> before_lease;
  };
  // The entries (registry), specs (catalog), placement and loads (admission) an Acquire
  // decides over, the door it asks, where its lease comes from and what a name waits for.
  AcquireService(Options options, cache::Registry& registry, ModelCatalog& models,
                 Admission& admission, const Access& access, LeaseIssuer& leases,
                 const PreloadGate& preloads);
  AcquireService(const AcquireService&) = delete;
  AcquireService& operator=(const AcquireService&) = delete;

  // `model`: the name to label the answer with (the asked spec's; the entry's own for a
  // fingerprint request), set as soon as it is known; `result`: the metrics classification.
  absl::Status Acquire(const Caller& caller, const v1::AcquireRequest& req,
                       v1::AcquireResponse* resp, std::string* model,
                       metrics::AcquireResult* result);

  // The answers so far, by result.
  struct Counts {
    uint64_t hits = 0, misses = 0, mismatches = 0, rejected = 0, errors = 0, peer_copies = 0,
             stale = 0, denied = 0;
  };
  Counts counts() const;

 private:
  struct Ask;
  struct Outcome {
    metrics::AcquireResult result;
    absl::Status status;
  };
  Outcome Serve(const Caller& caller, const v1::AcquireRequest& req, v1::AcquireResponse* resp,
                std::string* model);
  // The target: what `ask` names, once the caller may acquire it (and, by name, once its
  // preload is through and the files are as they were). An outcome ends the Acquire.
  std::optional<Outcome> ResolveFingerprint(Ask& ask);
  std::optional<Outcome> ResolveModel(Ask& ask);
  // By name: the files changed since they were opened. Refuses (stale) or identifies the new
  // contents and evicts the earlier version's entries.
  std::optional<Outcome> Refresh(Ask& ask, const std::string& changed);
  // Marks the entries served from earlier versions of `opened`'s files stale; the changes.
  std::string CheckStale(const std::shared_ptr<const load::OpenedModel>& opened);
  // Resident on another device of this node: served per --peer_policy.
  Outcome FromPeer(Ask& ask, const std::shared_ptr<cache::Entry>& src, v1::AcquireResponse* resp);
  // Not cached: loaded (load_on_miss), else a miss or a mismatch explained.
  Outcome OnMiss(Ask& ask, v1::AcquireResponse* resp);
  Outcome Diagnose(const Ask& ask);
  // A live entry: waited for if loading (wait_ready / load_on_miss), then leased.
  Outcome FromEntry(Ask& ask, const std::shared_ptr<cache::Entry>& e, v1::AcquireResponse* resp);
  // Records the lease and its token and fills the response, labelled with `name`. UNAVAILABLE
  // when the entry was evicted meanwhile. `packed_manifest`: the tensors as the entry's
  // serialized manifest (built once), else as `tensors`.
  absl::Status FillLease(const std::shared_ptr<cache::Entry>& e, const std::string& name,
                         const Caller& caller, bool packed_manifest, v1::AcquireResponse* resp);
  void Count(metrics::AcquireResult r);

  const Options options_;
  cache::Registry& registry_;
  ModelCatalog& models_;
  Admission& admission_;
  const Access& access_;
  LeaseIssuer& leases_;
  const PreloadGate& preloads_;
  ManifestCache manifests_;
  std::atomic<uint64_t> hits_{0}, misses_{0}, mismatches_{0}, rejected_{0}, errors_{0},
      peer_copies_{0}, stale_{0}, denied_{0};
};

}  // namespace weightcache::server
