// The daemon's link to weightcache-keeper (pkg/keeper): the registry's observer that has
// each entry deposited once it is ready and dropped once it is evicted; at start, the
// adoption of every entry the keeper holds (each checked against its files with the stale
// check: a stale or unusable one is dropped and reported), registered ready with source
// "keeper" without reading the disk; and a worker thread that does every later keeper
// request, notices the keeper going away (logged, weightcache_keeper_up 0), reconnects, and
// reconciles when a keeper is back: it drops what the daemon no longer holds and deposits
// what the keeper lacks. Compile artifacts held in memory (pkg/artifact) travel the same
// way under keys "artifact/<id>", one sealed memfd each, and are taken back at start.
//
// A keeper that is slow, frozen or gone never stops the daemon from serving: the observer
// calls only record what changed (a bounded set of keys) and wake the worker; only the
// worker talks to the keeper, each message bounded by `io_timeout`, and no lock is held
// across that I/O. The keeper serves one daemon at a time (pkg/keeper/server.h): at start
// the link waits up to `claim_wait` for another daemon to let go, then serves without it
// and keeps trying. An entry is deposited shortly after it is ready (Status: keeper
// pending_entries), so a daemon killed in that window loads it again at its restart.
// Not a public header.
//
// Thread-safety: every public method may be called from any thread; AdoptAll before
// StartWatch. Lifetimes: the backend, registry and metrics outlive it; destroy it (or
// Stop()) before the registry stops calling its observer; the spec_of / publisher_of
// callbacks are called on the worker thread until Stop() returns.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "pkg/artifact/store.h"
#include "pkg/cache/registry.h"
#include "pkg/keeper/client.h"
#include "pkg/memory/backend.h"
#include "pkg/metrics/metrics.h"
#include "pkg/server/keeper/keeper_record.h"
#include "pkg/util/mutex.h"
#include "pkg/util/scoped_fd.h"
#include "weightcache/v1/keeper_record.pb.h"
#include "weightcache/v1/weightcache.pb.h"

namespace weightcache::server {

class KeeperLink final : public cache::EntryObserver {
 public:
  struct Options {
    std::string socket_path;
    std::chrono::milliseconds retry{250};  // reconnect interval while the keeper is away
    // The most one keeper message may take (connect, greeting, each reply): a frozen keeper
    // costs the worker this, never a caller.
    std::chrono::milliseconds io_timeout{5000};
    // At start, how long to wait for another daemon that owns the keeper to let go (one
    // that is exiting does within its --shutdown_timeout).
    std::chrono::milliseconds claim_wait{10000};
    // At start, how long AdoptAll waits for one entry's fill (the digests of what it adopts:
    // a pass over every byte) before serving without it: this, plus the entry's bytes at
    // adoption_digest_rate (bytes per second, the slowest digest expected). Past the bound
    // the entry goes on being digested while the daemon serves; the keeper keeps its copy,
    // which is adopted when the digests end and dropped only if they fail.
    std::chrono::milliseconds adoption_wait{30000};
    double adoption_digest_rate = 256.0 * (1 << 20);
    // Keys waiting for the worker; past it they are forgotten and the worker reconciles
    // everything instead.
    size_t max_pending = 4096;
    // Who must serve `socket_path` (its SO_PEERCRED uid, checked before anything is deposited
    // or adopted); nullopt: this daemon's own euid (--keeper_uid names another). A keeper of
    // another uid is refused by name: logged, in Status (impostor, impostor_refusals) and
    // weightcache_keeper_impostors_total.
    std::optional<uid_t> keeper_uid;
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
  // until each is ready in the registry (at most Options::adoption_wait plus its bytes at
  // adoption_digest_rate; past that it is left to finish, the keeper keeping its copy). `admit`
  // decides, before anything is mapped, whether an entry of model `record.model()` may come back
  // under the current configuration (the daemon: only models still configured, or inline specs an
  // admin defined, which it then defines again); its refusal drops the entry from the keeper with
  // that reason. Returns the count adopted. No keeper, or one that another daemon keeps past
  // claim_wait: logged, 0. `published` is called with the publisher of each adopted published
  // entry.
  using AdmitFn = std::function<absl::Status(const v1::KeeperRecord& record)>;
  using PublishedFn = std::function<void(const cache::Key&, const v1::PublisherInfo&)>;
  size_t AdoptAll(const AdmitFn& admit, const PublishedFn& published = nullptr);
  // The artifact store whose in-memory artifacts the keeper holds too (AdoptAll gives it
  // back what the keeper held). Before AdoptAll; the store outlives the link's use of it.
  // Without one, artifact keys the keeper holds are dropped at the first reconcile.
  void SetArtifacts(artifact::Store* store);
  // Starts the worker (deposits, drops, hang-up, reconnect, reconcile).
  void StartWatch();
  // Ends a keeper request in flight at once and joins the worker. Idempotent.
  void Stop();

  // Record the change and wake the worker; never wait for the keeper.
  void BeforeReady(const cache::Entry& e, const load::LoadedModel& content) override;
  void Evicted(const cache::Entry& e) override;

  void Fill(v1::KeeperStatus* out) const;

  // The keeper key of an artifact: "artifact/<id>".
  static std::string ArtifactKey(const std::string& id);

 private:
  struct Mark {
    cache::Key key;
    bool readied = false;  // BeforeReady's (else an eviction's)
    uint64_t seq = 0;      // made again since the worker took it: do it again
  };
  struct Deposited {
    std::weak_ptr<const load::LoadedModel> content;  // what the keeper holds a copy of
    uint64_t fds = 0;
  };

  // Worker (and AdoptAll before it) only: the connection and the requests on it. An impostor
  // (a keeper of another uid) is recorded and logged here, once per uid it runs as.
  absl::Status Connect();
  void Lost(const absl::Status& why);
  // Deposits `e`'s ready content; RESOURCE_EXHAUSTED (the keeper's limit) keeps the link.
  absl::Status Deposit(const std::shared_ptr<cache::Entry>& e,
                       const std::shared_ptr<const load::LoadedModel>& c);
  // Makes the keeper hold exactly the registry's ready entries.
  absl::Status Reconcile();
  // Drops `key` from the keeper (gone already is fine) and forgets its deposit.
  absl::Status DropKey(const std::string& key);
  // Brings the keeper in step with one key's entry (deposit, drop or nothing); `*later`
  // when it cannot be yet (a readied
  // entry still loading past io_timeout: the mark stays pending, done on the next round).
  absl::Status Sync(const Mark& mark, bool* later);
  // Adoption at start (keeper_adoption.cc; AdoptAll too). Adopts one entry; the reason
  // when it cannot be (the caller drops it from the keeper unless the registry holds the
  // key: KeepsKeeperCopy). `*key` is set once the record names the entry, `*filling` once
  // the registry started its fill.
  absl::Status AdoptOne(keeper::KeeperClient::Entry held, const AdmitFn& admit,
                        const PublishedFn& published, std::optional<cache::Key>* key,
                        std::shared_ptr<cache::Entry>* filling);
  // Whether the keeper must keep key `k` that AdoptOne could not adopt now: its fill goes on
  // (handed to the worker through adopting_), the registry holds another live entry of the
  // key (whose own deposit replaces the keeper's copy), or the link is stopping (the next
  // daemon adopts it).
  bool KeepsKeeperCopy(const std::string& k, const std::optional<cache::Key>& key,
                       const std::shared_ptr<cache::Entry>& filling);
  // Worker: adopted entries whose fill outlasted AdoptAll's wait. Ready ones were recorded by
  // BeforeReady; failed ones are dropped from the keeper unless the registry holds the key.
  void SettleAdopting();
  // Gives one artifact back to the store; the reason when it cannot be.
  absl::Status AdoptArtifact(keeper::KeeperClient::Entry held);
  // Artifacts: deposit one, bring one id in step, and the reconcile's share.
  absl::Status DepositArtifact(const std::shared_ptr<const artifact::Artifact>& a);
  absl::Status SyncArtifact(const std::string& id);
  absl::Status ReconcileArtifacts(const std::set<std::string>& held, std::set<std::string>* kept,
                                  size_t* deposited);
  void ArtifactChanged(const std::string& id);
  void Run();
  // The worker's steps (Run); a false return: the link was lost (the worker idles or
  // reconnects next).
  void RecordAdopted();
  bool ReconcileIfDue();
  bool SyncMarks(size_t* synced);
  bool SyncChangedArtifacts(size_t* synced);
  // Waits for a wake-up, the keeper's hang-up or `timeout`, whichever comes first.
  void Idle(std::chrono::milliseconds timeout);
  void Wake();
  void Publish() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Descriptors the keeper holds for this daemon (0 while it is not connected).
  uint64_t HeldFdsLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void MarkLocked(const cache::Entry& e, bool readied) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool stopping() const;

  const Options options_;
  memory::Backend* const backend_;
  cache::Registry* const registry_;
  metrics::Metrics* const metrics_;
  const std::function<RecordedSpec(const std::string&)> spec_of_;
  const PublisherOfFn publisher_of_;
  artifact::Store* artifacts_ = nullptr;  // set before AdoptAll
  ScopedFd wake_;                         // an eventfd: a change or Stop() wakes the worker

  std::unique_ptr<keeper::KeeperClient> conn_;  // the worker's (AdoptAll's before it)
  bool reconciled_ = false;                     // conn_ is in step (worker's)
  bool refused_logged_ = false;                 // "another daemon owns it" said once

  // State shared with the observer calls and Status; never held across keeper I/O.
  mutable Mutex mu_;
  std::map<std::string, Mark> pending_ ABSL_GUARDED_BY(mu_);  // keys to bring in step
  uint64_t mark_seq_ ABSL_GUARDED_BY(mu_) = 0;
  bool overflow_ ABSL_GUARDED_BY(mu_) = false;  // pending_ passed its bound: reconcile all
  std::map<std::string, Deposited> deposited_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, cache::Key> adopted_keys_ ABSL_GUARDED_BY(mu_);  // held already
  // Adopted entries still being digested after AdoptAll (keeper key -> the registry's entry).
  std::map<std::string, std::shared_ptr<cache::Entry>> adopting_ ABSL_GUARDED_BY(mu_);
  // Artifact ids to bring in step, and what the keeper holds of each (keeper key -> blob).
  std::set<std::string> pending_artifacts_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::weak_ptr<const artifact::Artifact>> deposited_artifacts_
      ABSL_GUARDED_BY(mu_);
  uint64_t adopted_artifacts_ ABSL_GUARDED_BY(mu_) = 0;
  int io_fd_ ABSL_GUARDED_BY(mu_) = -1;  // conn_'s socket, shut down by Stop()
  bool up_ ABSL_GUARDED_BY(mu_) = false;
  bool ever_connected_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t adopted_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t dropped_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t deposits_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t failures_ ABSL_GUARDED_BY(mu_) = 0;
  std::string last_error_ ABSL_GUARDED_BY(mu_);
  uint64_t impostor_refusals_ ABSL_GUARDED_BY(mu_) = 0;
  std::string impostor_ ABSL_GUARDED_BY(mu_);  // the last refusal's message
  std::optional<uid_t> impostor_logged_;       // the worker's: its uid logged already
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread worker_;
};

}  // namespace weightcache::server
