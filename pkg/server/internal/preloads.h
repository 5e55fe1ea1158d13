// Preloads (DaemonOptions::preload): every known spec opened and its ranks started loading,
// on a thread of its own while the daemon serves (opening may hash files for minutes). Until
// a model's entries are registered its name is pending, and Acquires by it wait or hear why
// instead of a spurious miss; an integrity finding holds a name pending the same way until
// its clean copy's load is registered. Not a public header.
//
// Thread-safety: every method may be called from any thread. Lifetimes: the catalog,
// admission and access outlive the Preloads; Stop() joins the thread.
#pragma once

#include <chrono>
#include <functional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "pkg/cache/registry.h"
#include "pkg/server/internal/access.h"
#include "pkg/server/internal/admission.h"
#include "pkg/server/internal/model_catalog.h"
#include "pkg/spec/spec.h"
#include "pkg/util/mutex.h"

namespace weightcache::server {

// What an Acquire by name waits for (Preloads implements it): the name's preload through.
class PreloadGate {
 public:
  virtual ~PreloadGate() = default;
  // OK once `name` is not pending; UNAVAILABLE when `wait` is false, at the deadline or at
  // shutdown; CANCELLED when the caller is `gone`.
  virtual absl::Status Await(const std::string& name, bool wait,
                             std::chrono::steady_clock::time_point deadline,
                             const std::function<bool()>& gone) const = 0;
};

// What readiness reads of the preloads (Preloads implements it).
class PreloadProgress {
 public:
  virtual ~PreloadProgress() = default;
  // The names still being opened.
  virtual std::set<std::string> pending() const = 0;
  // The entries the preloads started (to tell when they are loaded).
  virtual std::vector<cache::Key> started() const = 0;
};

class Preloads final : public PreloadGate, public PreloadProgress {
 public:
  // `before_open`: tests only (DaemonHooks::BeforePreload), empty otherwise.
  Preloads(std::vector<spec::ModelSpec> specs, ModelCatalog& models, Admission& admission,
           const Access& access, std::function<void(const std::string&)> before_open);
  ~Preloads() override;
  Preloads(const Preloads&) = delete;
  Preloads& operator=(const Preloads&) = delete;

  // Marks every spec's name pending: before the daemon serves.
  void MarkPending();
  // Opens and starts the specs one by one on the preload thread: once what a load uses (peer
  // fill) is set up.
  void Start();
  // Holds `name` pending (false: it was already), and lets it go.
  bool Hold(const std::string& name);
  void Release(const std::string& name);
  absl::Status Await(const std::string& name, bool wait,
                     std::chrono::steady_clock::time_point deadline,
                     const std::function<bool()>& gone) const override;
  // Waits end (UNAVAILABLE), no further spec is opened, the thread is joined. Idempotent.
  void Stop();

  std::set<std::string> pending() const override;
  std::vector<cache::Key> started() const override;

 private:
  void Run();
  // Opens `s` and starts the loads of its ranks (a copy per namespace for a private model).
  void PreloadOne(const spec::ModelSpec& s);

  const std::vector<spec::ModelSpec> specs_;
  ModelCatalog& models_;
  Admission& admission_;
  const Access& access_;
  const std::function<void(const std::string&)> before_open_;

  mutable Mutex mu_;
  mutable CondVar cv_;
  std::set<std::string> pending_ ABSL_GUARDED_BY(mu_);
  std::vector<cache::Key> started_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace weightcache::server
