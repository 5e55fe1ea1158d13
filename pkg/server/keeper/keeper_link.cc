#include "pkg/server/keeper/keeper_link.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "pkg/util/log.h"
#include "pkg/util/status_macros.h"

namespace weightcache::server {
namespace {

// While another daemon owns the keeper, the link asks this many retry intervals apart (each
// try is a connection the keeper logs).
constexpr int kRefusedRetries = 8;

constexpr char kArtifactPrefix[] = "artifact/";

// A keeper error that leaves the connection usable: its descriptor limit.
bool KeepsTheConnection(const absl::Status& s) {
  return s.ok() || s.code() == absl::StatusCode::kResourceExhausted;
}

}  // namespace

KeeperLink::KeeperLink(Options options, memory::Backend* backend, cache::Registry* registry,
                       metrics::Metrics* metrics,
                       std::function<RecordedSpec(const std::string&)> spec_of,
                       PublisherOfFn publisher_of)
    : options_(std::move(options)),
      backend_(backend),
      registry_(registry),
      metrics_(metrics),
      spec_of_(std::move(spec_of)),
      publisher_of_(std::move(publisher_of)),
      wake_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {
  if (metrics_ != nullptr) metrics_->SetKeeperUp(false);
}

KeeperLink::~KeeperLink() { Stop(); }

void KeeperLink::Stop() {
  {
    MutexLock l(mu_);
    stopping_ = true;
    // A request in flight (a frozen keeper) ends now rather than at its timeout.
    if (io_fd_ >= 0) ::shutdown(io_fd_, SHUT_RDWR);
  }
  Wake();
  if (worker_.joinable()) worker_.join();
}

bool KeeperLink::stopping() const {
  MutexLock l(mu_);
  return stopping_;
}

void KeeperLink::Wake() {
  const uint64_t one = 1;
  (void)!::write(wake_.get(), &one, sizeof one);
}

absl::Status KeeperLink::Connect() {
  auto c =
      keeper::KeeperClient::Connect(options_.socket_path, options_.io_timeout, options_.keeper_uid);
  if (!c.ok()) {
    if (std::optional<uid_t> found = keeper::KeeperClient::ImpostorUid(c.status())) {
      const uid_t expected = options_.keeper_uid.value_or(::geteuid());
      if (impostor_logged_ != found) {
        WC_LOG_ERROR(
            "keeper: %s; an impostor (or a keeper started as another user): nothing is "
            "deposited or adopted until uid %d serves the socket (--keeper_uid names the uid "
            "the keeper runs as)",
            std::string(c.status().message()), static_cast<int>(expected));
        impostor_logged_ = found;
      }
      if (metrics_ != nullptr) metrics_->OnKeeperImpostor(*found, expected);
      MutexLock l(mu_);
      impostor_refusals_++;
      impostor_ = std::string(c.status().message());
      last_error_ = impostor_;
    }
    return c.status();
  }
  conn_ = std::move(c).value();
  reconciled_ = false;
  MutexLock l(mu_);
  if (stopping_) {
    conn_.reset();
    return absl::CancelledError("stopping");
  }
  io_fd_ = conn_->fd();
  return absl::OkStatus();
}

void KeeperLink::Lost(const absl::Status& why) {
  if (!conn_) return;
  bool was_up = false;
  {
    MutexLock l(mu_);
    io_fd_ = -1;  // before the close: Stop() never shuts down a reused number
    was_up = up_;
    up_ = false;
    last_error_ = std::string(why.message());
    Publish();
  }
  conn_.reset();
  reconciled_ = false;
  if (why.code() == absl::StatusCode::kFailedPrecondition) {
    if (!refused_logged_) {
      WC_LOG_WARN("keeper: %s; serving without it, asking again every %d ms",
                  std::string(why.message()),
                  static_cast<int>(kRefusedRetries * options_.retry.count()));
    }
    refused_logged_ = true;
    return;
  }
  if (was_up) {
    WC_LOG_ERROR(
        "keeper: lost (%s); the cache no longer outlives a daemon restart until a keeper is "
        "back (engines keep what they mapped; serving goes on)",
        std::string(why.message()));
  }
}

uint64_t KeeperLink::HeldFdsLocked() const {
  uint64_t fds = 0;
  if (up_) {
    for (const auto& [k, d] : deposited_) fds += d.fds;
    fds += deposited_artifacts_.size();  // one each
  }
  return fds;
}

std::string KeeperLink::ArtifactKey(const std::string& id) {
  return absl::StrCat(kArtifactPrefix, id);
}

void KeeperLink::SetArtifacts(artifact::Store* store) {
  artifacts_ = store;
  store->SetObserver([this](const std::string& id) { ArtifactChanged(id); });
}

void KeeperLink::ArtifactChanged(const std::string& id) {
  {
    MutexLock l(mu_);
    if (pending_artifacts_.size() < options_.max_pending) {
      pending_artifacts_.insert(id);
    } else {
      pending_artifacts_.clear();  // the worker reconciles everything instead
      overflow_ = true;
    }
  }
  Wake();
}

absl::Status KeeperLink::DepositArtifact(const std::shared_ptr<const artifact::Artifact>& a) {
  const std::string key = ArtifactKey(a->id());
  absl::Status s = conn_->Deposit(key, artifact::EncodeRecord(*a), {a->fd()});
  MutexLock l(mu_);
  if (s.ok()) {
    deposited_artifacts_[key] = a;
    deposits_++;
    Publish();
    return s;
  }
  failures_++;
  last_error_ = std::string(s.message());
  if (s.code() == absl::StatusCode::kResourceExhausted) {
    WC_LOG_WARN("keeper: artifact %s not deposited, served anyway: %s", a->id(), last_error_);
  }
  return s;
}

absl::Status KeeperLink::SyncArtifact(const std::string& id) {
  if (artifacts_ == nullptr) return absl::OkStatus();
  const std::string key = ArtifactKey(id);
  std::shared_ptr<const artifact::Artifact> a = artifacts_->InMemory(id);
  bool held = false;
  {
    MutexLock l(mu_);
    auto it = deposited_artifacts_.find(key);
    if (it != deposited_artifacts_.end()) {
      if (a && it->second.lock() == a) return absl::OkStatus();
      held = true;
    }
  }
  if (a) {
    const absl::Status s = DepositArtifact(a);
    return KeepsTheConnection(s) ? absl::OkStatus() : s;
  }
  return held ? DropKey(key) : absl::OkStatus();
}

absl::Status KeeperLink::ReconcileArtifacts(const std::set<std::string>& held,
                                            std::set<std::string>* kept, size_t* deposited) {
  if (artifacts_ == nullptr) return absl::OkStatus();
  for (const auto& a : artifacts_->ResidentArtifacts()) {
    const std::string key = ArtifactKey(a->id());
    {
      MutexLock l(mu_);
      auto it = deposited_artifacts_.find(key);
      if (held.count(key) != 0 && it != deposited_artifacts_.end() && it->second.lock() == a) {
        kept->insert(key);
        continue;
      }
    }
    absl::Status d = DepositArtifact(a);
    if (!KeepsTheConnection(d)) return d;
    if (d.ok()) {
      kept->insert(key);
      (*deposited)++;
    }
  }
  return absl::OkStatus();
}

void KeeperLink::Publish() {
  if (metrics_ == nullptr) return;
  metrics_->SetKeeperUp(up_);
  metrics_->SetKeeperDescriptors(HeldFdsLocked());
}

absl::Status KeeperLink::Deposit(const std::shared_ptr<cache::Entry>& entry,
                                 const std::shared_ptr<const load::LoadedModel>& content) {
  const cache::Entry& e = *entry;
  const auto digests = registry_->Digests(entry);
  std::vector<int> fds;
  fds.reserve(content->segments.size());
  for (const auto& s : content->segments) fds.push_back(s->fd());
  const std::string key = KeeperKey(e.fingerprint, e.device_uuid);
  // Only a published entry has a publisher (and only while its publish is known: asked for
  // source "publish" alone, so never after the publish unit is gone at teardown).
  std::optional<v1::PublisherInfo> publisher;
  if (publisher_of_ && e.source == "publish") publisher = publisher_of_(e.key);
  absl::Status s =
      conn_->Deposit(key,
                     EncodeKeeperRecord(e, *content, memory::BackendName(backend_->kind()),
                                        spec_of_ ? spec_of_(e.model) : RecordedSpec{},
                                        publisher ? &*publisher : nullptr, digests.get()),
                     fds);
  MutexLock l(mu_);
  if (s.ok()) {
    deposited_[key] = Deposited{content, fds.size()};
    deposits_++;
    Publish();
    return s;
  }
  failures_++;
  last_error_ = std::string(s.message());
  if (s.code() == absl::StatusCode::kResourceExhausted) {
    WC_LOG_WARN("keeper: %s (%s) not deposited, served anyway: %s", e.model, e.key.ToString(),
                last_error_);
  }
  return s;
}

absl::Status KeeperLink::DropKey(const std::string& key) {
  absl::Status s = conn_->Drop(key);
  if (!s.ok() && s.code() != absl::StatusCode::kNotFound) return s;
  MutexLock l(mu_);
  deposited_.erase(key);  // entry and artifact keys never collide ("artifact/" prefix)
  deposited_artifacts_.erase(key);
  Publish();
  return absl::OkStatus();
}

absl::Status KeeperLink::Sync(const Mark& mark, bool* later) {
  const cache::Key& key = mark.key;
  const std::string k = KeeperKey(key.fingerprint, key.device_uuid);
  std::shared_ptr<cache::Entry> e = registry_->Find(key);
  *later = false;
  // A ready mark is made just before the entry turns ready: wait for that (bounded, ends at
  // Stop). Past the bound (its load thread not yet run again: a busy node) the mark is kept
  // for the next round, never taken as done: the entry would go undeposited, and its
  // eviction would then find nothing to drop. An eviction's mark waits for nothing: a load
  // of the same key is another entry.
  if (e && mark.readied) {
    const absl::Status ready = registry_->WaitReady(
        e, std::chrono::steady_clock::now() + options_.io_timeout, [this] { return stopping(); });
    if (ready.code() == absl::StatusCode::kDeadlineExceeded) {
      *later = true;
      return absl::OkStatus();
    }
  }
  std::shared_ptr<const load::LoadedModel> content;
  if (e) content = registry_->Content(e).value_or(nullptr);  // null unless ready
  bool held = false;
  {
    MutexLock l(mu_);
    auto it = deposited_.find(k);
    if (it != deposited_.end()) {
      if (content && it->second.content.lock() == content) return absl::OkStatus();
      held = true;
    }
  }
  if (content) {
    const absl::Status s = Deposit(e, content);  // replaces what the keeper held
    return KeepsTheConnection(s) ? absl::OkStatus() : s;
  }
  return held ? DropKey(k) : absl::OkStatus();
}

absl::Status KeeperLink::Reconcile() {
  WC_ASSIGN_OR_RETURN(auto held_entries, conn_->Adopt());  // the keys (descriptors closed)
  std::set<std::string> held;
  for (const auto& h : held_entries) held.insert(h.key);
  held_entries.clear();
  std::set<std::string> kept;
  size_t deposited = 0, dropped = 0;
  for (const auto& s : registry_->Snapshot()) {
    if (s.state != cache::State::kReady) continue;
    auto e = registry_->Find({s.fingerprint, s.device_uuid});
    if (!e) continue;
    auto content = registry_->Content(e);
    if (!content.ok()) continue;
    const std::string k = KeeperKey(e->fingerprint, e->device_uuid);
    {
      MutexLock l(mu_);
      auto it = deposited_.find(k);
      if (held.count(k) != 0 && it != deposited_.end() && it->second.content.lock() == *content) {
        kept.insert(k);
        continue;
      }
    }
    absl::Status d = Deposit(e, *content);
    if (!KeepsTheConnection(d)) return d;
    if (d.ok()) {
      kept.insert(k);
      deposited++;
    }
  }
  WC_RETURN_IF_ERROR(ReconcileArtifacts(held, &kept, &deposited));
  {
    MutexLock l(mu_);  // still being digested: adopted when ready (SettleAdopting)
    for (const auto& [k, e] : adopting_) {
      if (held.count(k) != 0) kept.insert(k);
    }
  }
  for (const auto& k : held) {
    if (kept.count(k) != 0) continue;
    absl::Status d = conn_->Drop(k);
    if (!d.ok() && d.code() != absl::StatusCode::kNotFound) return d;
    dropped++;
  }
  {
    MutexLock l(mu_);
    for (auto it = deposited_.begin(); it != deposited_.end();) {
      it = kept.count(it->first) != 0 ? std::next(it) : deposited_.erase(it);
    }
    for (auto it = deposited_artifacts_.begin(); it != deposited_artifacts_.end();) {
      it = kept.count(it->first) != 0 ? std::next(it) : deposited_artifacts_.erase(it);
    }
    up_ = true;
    last_error_.clear();
    Publish();
    WC_LOG_INFO("keeper: connected on %s%s; it held %d entries: %d kept, %d deposited, %d dropped",
                options_.socket_path, ever_connected_ ? " again" : "",
                static_cast<int>(held.size()), static_cast<int>(kept.size() - deposited),
                static_cast<int>(deposited), static_cast<int>(dropped));
    ever_connected_ = true;
  }
  refused_logged_ = false;
  reconciled_ = true;
  return absl::OkStatus();
}

void KeeperLink::StartWatch() {
  worker_ = std::thread([this] { Run(); });
}

void KeeperLink::MarkLocked(const cache::Entry& e, bool readied) {
  const std::string k = KeeperKey(e.fingerprint, e.device_uuid);
  auto it = pending_.find(k);
  if (it != pending_.end()) {
    it->second.readied = it->second.readied || readied;
    it->second.seq = ++mark_seq_;
  } else if (pending_.size() < options_.max_pending) {
    pending_.emplace(k, Mark{e.key, readied, ++mark_seq_});
  } else {
    pending_.clear();  // the worker reconciles every entry instead
    overflow_ = true;
  }
}

void KeeperLink::BeforeReady(const cache::Entry& e, const load::LoadedModel& /*content*/) {
  {
    MutexLock l(mu_);
    if (e.source == "keeper") {  // adopted: the keeper holds it already
      adopted_keys_[KeeperKey(e.fingerprint, e.device_uuid)] = e.key;
    } else {
      MarkLocked(e, /*readied=*/true);
    }
  }
  Wake();
}

void KeeperLink::Evicted(const cache::Entry& e) {
  {
    MutexLock l(mu_);
    MarkLocked(e, /*readied=*/false);
  }
  Wake();
}

void KeeperLink::Run() {
  while (!stopping()) {
    RecordAdopted();
    if (!conn_) {
      if (absl::Status s = Connect(); !s.ok()) {
        // An impostor: asked less often, as a keeper another daemon owns.
        Idle(s.code() == absl::StatusCode::kPermissionDenied ? kRefusedRetries * options_.retry
                                                             : options_.retry);
        continue;
      }
    }
    if (!ReconcileIfDue()) continue;
    size_t marks = 0, artifacts = 0;
    if (!SyncMarks(&marks) || !SyncChangedArtifacts(&artifacts)) continue;
    if (marks != 0 || artifacts != 0) continue;  // more may have come
    Idle(options_.retry);
  }
  // Stopping: the keeper keeps what it holds (a daemon stopped for an upgrade adopts it).
  {
    MutexLock l(mu_);
    io_fd_ = -1;
    up_ = false;
    Publish();
  }
  conn_.reset();
}

// Adopted entries: recorded without a request (their content, for the reconcile).
void KeeperLink::RecordAdopted() {
  SettleAdopting();
  std::map<std::string, cache::Key> adopted;
  {
    MutexLock l(mu_);
    adopted.swap(adopted_keys_);
  }
  for (const auto& [k, key] : adopted) {
    auto e = registry_->Find(key);
    if (!e) continue;
    const absl::Status ready = registry_->WaitReady(
        e, std::chrono::steady_clock::now() + options_.io_timeout, [this] { return stopping(); });
    if (ready.code() == absl::StatusCode::kDeadlineExceeded) {
      MutexLock l(mu_);  // not ready yet (see Sync): recorded on the next round
      adopted_keys_.emplace(k, key);
      continue;
    }
    if (!ready.ok()) continue;
    auto content = registry_->Content(e);
    if (!content.ok()) continue;
    MutexLock l(mu_);
    deposited_[k] = Deposited{*content, (*content)->segments.size()};
    Publish();
  }
}

// Decides whether the keeper needs a whole reconcile (a new connection, or marks past their
// bound) and does it; false when it failed (the link is lost and the worker has idled).
bool KeeperLink::ReconcileIfDue() {
  bool reconcile = !reconciled_;
  {
    MutexLock l(mu_);
    reconcile = reconcile || overflow_;
    overflow_ = false;
  }
  if (!reconcile) return true;
  if (absl::Status s = Reconcile(); !s.ok()) {
    Lost(s);
    // Another daemon owns the keeper: ask less often (each try is a connection).
    Idle(s.code() == absl::StatusCode::kFailedPrecondition ? kRefusedRetries * options_.retry
                                                           : options_.retry);
    return false;
  }
  return true;
}

// Brings the keeper in step with each entry's mark; `synced`: the marks taken. Each mark
// stays pending (and counted in Status) until the keeper is in step with it; one made again
// meanwhile (a newer seq) is done again.
bool KeeperLink::SyncMarks(size_t* synced) {
  std::map<std::string, Mark> pending;
  {
    MutexLock l(mu_);
    pending = pending_;
  }
  *synced = pending.size();
  for (const auto& [k, mark] : pending) {
    bool later = false;
    if (absl::Status s = Sync(mark, &later); !s.ok()) {
      Lost(s);
      return false;
    }
    if (later) continue;  // still pending: the worker comes back to it
    MutexLock l(mu_);
    auto it = pending_.find(k);
    if (it != pending_.end() && it->second.seq == mark.seq) pending_.erase(it);
  }
  return true;
}

// Brings the keeper in step with each changed artifact; `synced`: the ids taken. Taken from
// the set before the sync, so a change meanwhile is seen again.
bool KeeperLink::SyncChangedArtifacts(size_t* synced) {
  std::set<std::string> artifacts;
  {
    MutexLock l(mu_);
    artifacts.swap(pending_artifacts_);
  }
  *synced = artifacts.size();
  for (auto it = artifacts.begin(); it != artifacts.end(); ++it) {
    if (absl::Status s = SyncArtifact(*it); !s.ok()) {
      {
        MutexLock l(mu_);
        pending_artifacts_.insert(it, artifacts.end());  // not done: after the reconcile
      }
      Lost(s);
      return false;
    }
  }
  return true;
}

void KeeperLink::Idle(std::chrono::milliseconds timeout) {
  pollfd p[2] = {{wake_.get(), POLLIN, 0}, {conn_ ? conn_->fd() : -1, POLLRDHUP, 0}};
  const int n = ::poll(p, conn_ ? 2 : 1, static_cast<int>(timeout.count()));
  if (n <= 0) return;
  if ((p[0].revents & POLLIN) != 0) {
    uint64_t v;
    (void)!::read(wake_.get(), &v, sizeof v);
  }
  // Stop() shuts the connection down itself: that hang-up is not the keeper's, and not
  // logged as a lost keeper.
  if (conn_ && !stopping() && (p[1].revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0) {
    Lost(absl::UnavailableError("the keeper closed its connection (it exited?)"));
  }
}

void KeeperLink::Fill(v1::KeeperStatus* out) const {
  MutexLock l(mu_);
  out->set_socket(options_.socket_path);
  out->set_up(up_);
  out->set_adopted_entries(adopted_);
  out->set_dropped_entries(dropped_);
  out->set_descriptors(HeldFdsLocked());
  out->set_deposits(deposits_);
  out->set_deposit_failures(failures_);
  out->set_last_error(last_error_);
  out->set_pending_entries(pending_.size() + adopted_keys_.size() + adopting_.size() +
                           pending_artifacts_.size() + (overflow_ ? 1 : 0));
  out->set_artifacts(up_ ? deposited_artifacts_.size() : 0);
  out->set_adopted_artifacts(adopted_artifacts_);
  out->set_keeper_uid(options_.keeper_uid.value_or(::geteuid()));
  out->set_impostor(impostor_);
  out->set_impostor_refusals(impostor_refusals_);
}

}  // namespace weightcache::server
