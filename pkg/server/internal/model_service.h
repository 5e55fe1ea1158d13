// The model verbs: Load (an admin's inline spec defined by a Load that succeeds; the ranks
// of a known model started together and reported until they end) and Evict (every device's
// entry of a fingerprint, or of a spec and what it reproduces). Not a public header.
//
// Thread-safety: every method may be called from any thread (gRPC's). Lifetimes: everything
// passed to the constructor outlives the service.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "pkg/cache/registry.h"
#include "pkg/memory/backend.h"
#include "pkg/server/internal/access.h"
#include "pkg/server/internal/admission.h"
#include "pkg/server/internal/model_catalog.h"
#include "weightcache/v1/weightcache.pb.h"

namespace weightcache::server {

class ModelService {
 public:
  struct Options {
    // A non-admin Load re-reads a model's files at most this often (admins: every Load).
    std::chrono::milliseconds refresh_interval{10000};
    bool namespace_rules = false;  // private copies (isolation: namespace) need them
  };
  ModelService(Options options, memory::Backend* backend, cache::Registry& registry,
               ModelCatalog& models, Admission& admission, const Access& access);
  ModelService(const ModelService&) = delete;
  ModelService& operator=(const ModelService&) = delete;

  // Starts (or joins) the loads; `publish` is called with progress until they end (false:
  // the client went away, CANCELLED).
  using Publish = std::function<bool(const v1::LoadProgress&)>;
  absl::Status Load(const Caller& caller, const v1::LoadRequest& req, const Publish& publish);
  absl::Status Evict(const Caller& caller, const v1::EvictRequest& req, v1::EvictResponse* resp);

 private:
  // Load of a model defined already (by the spec file, or by `req`'s inline spec just now).
  absl::Status LoadDefined(const Caller& caller, const std::string& name,
                           const v1::LoadRequest& req, const Publish& publish);
  // What a Load starts: each asked layout (the request's rank, else every rank of the spec)
  // for each namespace whose copy it fills, on its device with its environment.
  absl::StatusOr<std::vector<Admission::GroupRank>> Placements(
      const Caller& caller, const v1::LoadRequest& req, const load::OpenedModel& opened) const;
  // Reports the entries' progress until every one ended: OK when all are ready.
  absl::Status Report(const std::string& name,
                      const std::vector<std::shared_ptr<cache::Entry>>& entries,
                      const Publish& publish);
  // The keys an Evict of `req` names, and the other names that lose them.
  absl::StatusOr<std::vector<cache::Key>> EvictKeys(const v1::EvictRequest& req,
                                                    std::set<std::string>* other_names);

  const Options options_;
  memory::Backend* const backend_;
  cache::Registry& registry_;
  ModelCatalog& models_;
  Admission& admission_;
  const Access& access_;
};

}  // namespace weightcache::server
