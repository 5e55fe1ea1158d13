// The daemon's link to weightcache-keeper (pkg/keeper): the registry's observer that
// deposits each entry before it is announced ready and drops it on eviction; at start, the
// adoption of every entry the keeper holds (each checked against its files with the stale
// check: a stale or unusable one is dropped and reported), registered ready with source
// "keeper" without reading the disk; and a watcher that notices the keeper going away (logged,
// weightcache_keeper_up 0), reconnects, and deposits again every ready entry when a keeper
// is back. A keeper that is absent or refuses never stops the daemon from serving.
// Not a public header.
//
// Thread-safety: every method may be called from any thread; one keeper request at a time
// (a mutex around the connection). Lifetimes: the backend, registry and metrics outlive it;
// destroy it (or Stop()) before the registry stops calling its observer.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "pkg/cache/registry.h"
#include "pkg/keeper/client.h"
#include "pkg/memory/backend.h"
#include "pkg/metrics/metrics.h"
#include "pkg/spec/spec.h"
#include "pkg/util/mutex.h"
#include "weightcache/v1/keeper_record.pb.h"
#include "weightcache/v1/weightcache.pb.h"

namespace weightcache::server {

// The record of a ready entry (what the keeper keeps beside its descriptors), and back:
// pure functions. Decoding checks the format, that the fingerprint inputs reproduce the
// fingerprint and that every tensor lies inside its segment; INVALID_ARGUMENT naming the
// field otherwise.
// `publisher`: who published a published entry (null for a loaded one).
// The spec an entry was loaded under, as recorded with its deposit.
struct RecordedSpec {
  std::string yaml;             // canonical YAML; empty when unknown
  bool defined_inline = false;  // an admin's inline spec, not the spec file's
};
std::string EncodeKeeperRecord(const cache::Entry& e, const load::LoadedModel& content,
                               const std::string& backend, const RecordedSpec& spec,
                               const v1::PublisherInfo* publisher = nullptr);
struct AdoptableRecord {
  v1::KeeperRecord record;
  spec::FingerprintInputs inputs;
  std::vector<load::SourceFile> files;
  load::Plan plan;
};
absl::StatusOr<AdoptableRecord> DecodeKeeperRecord(const std::string& body);

class KeeperLink final : public cache::EntryObserver {
 public:
  struct Options {
    std::string socket_path;
    std::chrono::milliseconds retry{250};  // reconnect interval while the keeper is away
  };
  // `spec_of(model)`: the spec recorded with a deposit;
  // `publisher_of(key)`: who published an entry of source "publish" (recorded with it).
  using PublisherOfFn = std::function<std::optional<v1::PublisherInfo>(const cache::Key&)>;
  KeeperLink(Options options, memory::Backend* backend, cache::Registry* registry,
             metrics::Metrics* metrics, std::function<RecordedSpec(const std::string&)> spec_of,
             PublisherOfFn publisher_of = nullptr);
  ~KeeperLink() override;
  KeeperLink(const KeeperLink&) = delete;
  KeeperLink& operator=(const KeeperLink&) = delete;

  // At start, before serving: connects and adopts every entry the keeper holds, waiting
  // until each is ready in the registry. `admit` decides, before anything is mapped, whether
  // an entry of model `record.model()` may come back under the current configuration (the
  // daemon: only models still configured, or inline specs an admin defined, which it then
  // defines again); its refusal drops the entry from the keeper with that reason. Returns
  // the count adopted. No keeper: logged, 0.
  // `published` is called with the publisher of each adopted published entry.
  using AdmitFn = std::function<absl::Status(const v1::KeeperRecord& record)>;
  using PublishedFn = std::function<void(const cache::Key&, const v1::PublisherInfo&)>;
  size_t AdoptAll(const AdmitFn& admit, const PublishedFn& published = nullptr);
  // Starts the watcher thread (hang-up, reconnect, re-deposit).
  void StartWatch();
  void Stop();

  void BeforeReady(const cache::Entry& e, const load::LoadedModel& content) override;
  void Evicted(const cache::Entry& e) override;

  void Fill(v1::KeeperStatus* out) const;

 private:
  // Connected (connecting when not); UNAVAILABLE when no keeper answers.
  absl::Status EnsureConnectedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void LostLocked(const absl::Status& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status DepositLocked(const cache::Entry& e, const load::LoadedModel& content)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Adopts one entry; the reason when it cannot be (the caller drops it from the keeper).
  absl::Status AdoptOne(keeper::KeeperClient::Entry held, const AdmitFn& admit,
                        const PublishedFn& published);
  void Watch();
  void RedepositAll();
  void Publish() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Options options_;
  memory::Backend* const backend_;
  cache::Registry* const registry_;
  metrics::Metrics* const metrics_;
  const std::function<RecordedSpec(const std::string&)> spec_of_;
  const PublisherOfFn publisher_of_;

  mutable Mutex mu_;
  std::unique_ptr<keeper::KeeperClient> conn_ ABSL_GUARDED_BY(mu_);
  bool ever_connected_ ABSL_GUARDED_BY(mu_) = false;
  std::map<std::string, uint64_t> deposited_ ABSL_GUARDED_BY(mu_);  // key -> descriptors
  uint64_t adopted_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t dropped_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t deposits_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t failures_ ABSL_GUARDED_BY(mu_) = 0;
  std::string last_error_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool redeposit_ ABSL_GUARDED_BY(mu_) = false;  // a (re)connection needs every entry again
  CondVar cv_;
  std::thread watcher_;
};

}  // namespace weightcache::server
