// The specs a daemon knows and the models opened from them: config, allowlist, headers and
// content digests (pkg/identity, through the daemon's digest store), cached by spec name,
// with the reason a spec could not be opened (for `list`). Which spec names serve a cache
// entry is decided here too: those whose own layout and content reproduce its fingerprint.
// Not a public header.
//
// Thread-safety: every method may be called from any thread; opening (file reads, hashing)
// runs outside the lock. Lifetimes: OpenedModels are shared and immutable.
#pragma once

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "pkg/cache/registry.h"
#include "pkg/identity/identity.h"
#include "pkg/load/model.h"
#include "pkg/metrics/metrics.h"
#include "pkg/server/keeper/keeper_record.h"
#include "pkg/spec/spec.h"
#include "pkg/util/mutex.h"

namespace weightcache::server {

class ModelCatalog {
 public:
  // `model_roots`: model directories must resolve (symlinks followed) under one of these
  // (empty: anywhere); a refusal is PERMISSION_DENIED naming the rule, counted in `metrics`
  // (may be null).
  ModelCatalog(const std::vector<spec::ModelSpec>& specs, unsigned hash_threads,
               const std::vector<std::string>& model_roots, metrics::Metrics* metrics);

  // Keeper adoption: whether an entry the keeper kept for model `name` (read from
  // `model_dir`; `defined_inline` by an admin with `spec_yaml`) may come back under the current
  // configuration. A model removed from the spec file was revoked, and must not come back at
  // restart without the access rules the file would now give it (issue 25); an admin's inline
  // spec is defined again as the admin wrote it.
  absl::Status AdmitKept(const std::string& name, const std::string& model_dir, bool defined_inline,
                         const std::string& spec_yaml);

  // The digest store (persisted at `path`; empty: memory only). Call once, before Open.
  absl::Status OpenDigestStore(const std::string& path);

  // What a Define replaced: given back to Restore when the new spec is refused.
  struct Previous {
    std::string name;
    std::optional<spec::ModelSpec> spec;  // none: the name was not defined
    bool defined_inline = false;
  };
  // Adds or replaces a spec (an inline spec of a Load request: an admin's). What was opened
  // under the name before is forgotten: the next Open reads the new spec's files.
  Previous Define(const spec::ModelSpec& s);
  // Puts back what a Define replaced (a refused inline spec leaves nothing behind).
  void Restore(const Previous& previous);
  // Whether `name`'s spec is an inline one (Define), not the spec file's.
  bool DefinedInline(const std::string& name) const;
  std::optional<spec::ModelSpec> Spec(const std::string& name) const;
  // Its canonical YAML (spec::ToYaml, made once when defined: yaml-cpp's emitter costs tens of
  // microseconds, too much for every Acquire); empty when unknown.
  std::string SpecYaml(const std::string& name) const;
  // What a record of one of `name`'s entries carries of its spec (the keeper's, the peer API's).
  RecordedSpec Recorded(const std::string& name) const {
    return RecordedSpec{SpecYaml(name), DefinedInline(name)};
  }

  // The opened model of spec `name`: cached unless `refresh` (which re-reads the files and
  // re-hashes only file versions the store does not know). NOT_FOUND naming the known specs.
  absl::StatusOr<std::shared_ptr<const load::OpenedModel>> Open(const std::string& name,
                                                                bool refresh);
  // Whether a refresh of `name` is due: true (and the time taken) when none was taken in the
  // last `interval`; a rate limit for callers that may not re-read the files at will.
  bool TakeRefresh(const std::string& name, std::chrono::milliseconds interval);
  // Every opened spec, by name (a copy).
  std::map<std::string, std::shared_ptr<const load::OpenedModel>> Opened() const;

  // Every known spec name whose own layout (tp/pp sizes) and content reproduce entry `s`
  // (its loader's name always among them), sorted.
  std::vector<std::string> NamesOf(const cache::EntrySnapshot& s) const;

  struct Known {
    spec::ModelSpec spec;
    std::string refused;  // why it could not be opened; empty when it could (or never tried)
  };
  std::vector<Known> List() const;  // sorted by name
  std::vector<std::string> Names() const;

  uint64_t hashed_bytes() const;  // read to hash files since start
  // Shutdown: hashing in progress stops (its Open fails with CANCELLED).
  void Stop() { stopping_ = true; }

 private:
  // --model_roots: the model dir and every file the loader may read in it resolve under a
  // root; PERMISSION_DENIED naming the path, what it resolves to and the roots otherwise.
  absl::Status CheckRoots(const spec::ModelSpec& s) const;
  absl::Status CheckPath(const spec::ModelSpec& s, const std::string& what,
                         const std::string& path) const;

  const unsigned hash_threads_;
  std::atomic<bool> stopping_{false};
  std::vector<std::string> roots_;  // resolved
  metrics::Metrics* const metrics_;
  std::unique_ptr<identity::DigestStore> digests_;  // set once by OpenDigestStore
  mutable Mutex mu_;
  void ForgetOpenedLocked(const std::string& name) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  std::map<std::string, spec::ModelSpec> specs_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::string> yaml_ ABSL_GUARDED_BY(mu_);  // name -> canonical YAML
  std::set<std::string> inline_ ABSL_GUARDED_BY(mu_);             // names Define()d
  std::map<std::string, std::chrono::steady_clock::time_point> refreshed_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::shared_ptr<const load::OpenedModel>> opened_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::string> open_errors_ ABSL_GUARDED_BY(mu_);
};

}  // namespace weightcache::server
