// The daemon's integrity service (issue 27, docs/integrity.md): every fill digested before
// its entry is ready (the registry's digester), the scrubber that re-digests ready entries,
// what a finding means (the entry out of service, its lease holders told, the finding recorded
// for Status, a clean copy loaded from the checkpoint at most once per interval), and
// VerifyResident. Not a public header.
//
// Thread-safety: every method may be called from any thread; OnCorrupt runs on the scrubber's
// thread (or a VerifyResident's gRPC thread). Lifetimes: the registry, catalog, admission,
// access and metrics outlive the service; Stop() it before the handle channel goes (its
// findings are told through it).
#pragma once

#include <chrono>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "pkg/cache/registry.h"
#include "pkg/memory/backend.h"
#include "pkg/server/integrity/scrubber.h"
#include "pkg/server/internal/access.h"
#include "pkg/server/internal/admission.h"
#include "pkg/server/internal/model_catalog.h"
#include "pkg/util/mutex.h"
#include "weightcache/v1/weightcache.pb.h"

namespace weightcache::metrics {
class Metrics;
}  // namespace weightcache::metrics

namespace weightcache::server {

class IntegrityService {
 public:
  // What a finding asks of the rest of the daemon.
  struct Links {
    // Tells the holder of lease `lease_id` the event line `line` (the handle channel).
    std::function<void(const std::string& lease_id, const std::string& line)> notify;
    // Holds Acquires by `model`'s name until the clean copy's load is registered (as during a
    // preload); false when something holds them already. Then `release`s them.
    std::function<bool(const std::string& model)> hold;
    std::function<void(const std::string& model)> release;
  };
  struct Options {
    Scrubber::Options scrub;
    // An entry key found corrupt again within this interval of its last reload is not
    // reloaded (DaemonOptions::corrupt_reload_interval); 0: every finding reloads.
    std::chrono::milliseconds reload_interval{600000};
  };
  // Sets the registry's digester. `digest_hook`: tests only (DaemonHooks), empty otherwise.
  IntegrityService(Options options, memory::BackendKind kind, cache::Registry& registry,
                   ModelCatalog& models, Admission& admission, const Access& access, Links links,
                   metrics::Metrics* metrics, Scrubber::DigestHook digest_hook);
  IntegrityService(const IntegrityService&) = delete;
  IntegrityService& operator=(const IntegrityService&) = delete;

  void Start() { scrubber_->Start(); }
  // A digest in progress ends at its next piece. Idempotent.
  void Stop() { scrubber_->Stop(); }

  // Admin only: digests every ready entry of `req.model()` now, unthrottled; a changed one is
  // a finding like the scrubber's.
  absl::Status VerifyResident(const Caller& caller, const v1::VerifyResidentRequest& req,
                              v1::VerifyResidentResponse* resp);
  // A finding: `e`'s memory changed (`what` says where). Out of service first, then its lease
  // holders told, recorded (AppendFindings; also when no lease maps it) and, when it was
  // serving, a clean copy loaded (not for published weights: no checkpoint has them; not
  // twice within reload_interval). A draining entry (evicted, still mapped) is not reloaded.
  void OnCorrupt(const std::shared_ptr<cache::Entry>& e, const std::string& what);
  // The last kMaxFindings findings, oldest first (StatusResponse.integrity_findings).
  static constexpr size_t kMaxFindings = 32;
  void AppendFindings(v1::StatusResponse* resp) const;

 private:
  // Loads a clean copy of `e`; returns what was done, or why nothing was.
  std::string ReloadCorrupt(const std::shared_ptr<cache::Entry>& e);
  // Keeps a finding for Status (the last kMaxFindings); returns its number for SetReload.
  uint64_t Record(const std::shared_ptr<cache::Entry>& e, const std::string& what, cache::State was,
                  size_t told, const std::string& reload);
  // What was done about a clean copy, once decided (the finding may have gone already).
  void SetReload(uint64_t seq, const std::string& reload);

  cache::Registry& registry_;
  ModelCatalog& models_;
  Admission& admission_;
  const Access& access_;
  const Links links_;
  metrics::Metrics* const metrics_;
  const std::chrono::milliseconds reload_interval_;
  mutable Mutex mu_;
  // When a clean copy of each entry key was last loaded after a finding.
  std::map<cache::Key, std::chrono::steady_clock::time_point> reloaded_ ABSL_GUARDED_BY(mu_);
  struct Finding {
    uint64_t seq = 0;  // Record's answer, for SetReload
    std::chrono::steady_clock::time_point at;
    v1::IntegrityFinding info;
  };
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<Finding> findings_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<Scrubber> scrubber_;
};

}  // namespace weightcache::server
