#include "pkg/cache/registry.h"

#include <algorithm>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "pkg/util/bytes.h"
#include "pkg/util/log.h"

namespace weightcache::cache {

const char* StateName(State s) {
  switch (s) {
    case State::kLoading:
      return "loading";
    case State::kReady:
      return "ready";
    case State::kEvicting:
      return "evicting";
    case State::kGone:
      return "gone";
    case State::kFailed:
      return "failed";
    case State::kDraining:
      return "draining";
  }
  return "unknown";
}

std::string Key::ToString() const {
  return absl::StrCat(fingerprint.substr(0, 12), "@", device_uuid);
}

Registry::Registry(uint64_t budget_bytes) : budget_(budget_bytes) {}

bool Registry::Pinned(const Entry& e) const {
  for (const auto& [id, lease] : e.leases) {
    if (lease.claimed) return true;
  }
  return false;
}

Registry::~Registry() {
  Stop();  // loads in progress end at their next chunk
  JoinLoads();
}

std::vector<std::string> Registry::JoinLoads() {
  std::map<uint64_t, std::thread> loads;
  std::vector<std::string> running;
  {
    MutexLock l(mu_);
    loads.swap(loads_);
    finished_loads_.clear();
    for (const auto& [key, e] : entries_) {
      if (e->state != State::kLoading) continue;
      running.push_back(absl::StrCat(e->model, " ", key.ToString(), " from ", e->source, " (",
                                     e->progress.done(), " of ", e->progress.total(), " bytes)"));
    }
  }
  for (auto& [id, t] : loads) t.join();
  return running;
}

size_t Registry::load_threads() const {
  MutexLock l(mu_);
  return loads_.size();
}

void Registry::SetLoadDoneCallback(LoadDoneFn fn) {
  MutexLock l(mu_);
  on_done_ = std::move(fn);
}

void Registry::SetEvictCallback(EvictFn fn) {
  MutexLock l(mu_);
  on_evict_ = std::move(fn);
}

void Registry::SetBudgetRefusedCallback(RefusedFn fn) {
  MutexLock l(mu_);
  on_refused_ = std::move(fn);
}

void Registry::SetLingeringSource(LingeringFn fn) {
  MutexLock l(mu_);
  lingering_ = std::move(fn);
}

void Registry::SetObserver(EntryObserver* observer) {
  MutexLock l(mu_);
  observer_ = observer;
}

void Registry::NotifyEvicted(const std::vector<std::shared_ptr<Entry>>& evicted,
                             const std::string& reason, const EvictFn& on_evict,
                             EntryObserver* observer) {
  for (const auto& e : evicted) {
    if (observer != nullptr) observer->Evicted(*e);
    if (on_evict) on_evict(e->model, reason);
  }
}

uint64_t Registry::UsedLocked(const std::string* device_uuid) const {
  uint64_t n = 0;
  for (const auto& [key, e] : entries_) {
    if (device_uuid != nullptr && key.device_uuid != *device_uuid) continue;
    if (e->state == State::kLoading || e->state == State::kReady) n += e->reserved_bytes;
  }
  for (const auto& e : draining_) {
    if (device_uuid == nullptr || e->device_uuid == *device_uuid) n += e->reserved_bytes;
  }
  return n;
}

uint64_t Registry::used_bytes() const {
  MutexLock l(mu_);
  return UsedLocked(nullptr);
}

uint64_t Registry::used_bytes(const std::string& device_uuid) const {
  MutexLock l(mu_);
  return UsedLocked(&device_uuid);
}

absl::StatusOr<std::shared_ptr<Entry>> Registry::StartOrJoin(LoadRequest req, bool* started) {
  if (started != nullptr) *started = false;
  std::vector<std::shared_ptr<const load::LoadedModel>> drop;  // freed outside the lock
  std::vector<std::shared_ptr<Entry>> evicted;
  std::shared_ptr<Entry> e;
  EvictFn on_evict;
  RefusedFn on_refused;
  absl::Status refused;
  EntryObserver* observer = nullptr;
  const std::string& device = req.key.device_uuid;
  std::vector<std::thread> finished;  // joined outside the lock
  absl::Cleanup join_finished = [&finished] {
    for (auto& t : finished) t.join();
  };
  {
    MutexLock l(mu_);
    if (stopping_) return absl::UnavailableError("registry is shutting down");
    for (uint64_t id : finished_loads_) {
      auto t = loads_.find(id);
      if (t == loads_.end()) continue;
      finished.push_back(std::move(t->second));
      loads_.erase(t);
    }
    finished_loads_.clear();
    auto it = entries_.find(req.key);
    if (it != entries_.end() && it->second->state != State::kFailed) return it->second;
    if (it != entries_.end()) entries_.erase(it);  // a failed entry is retried
    if (budget_ != 0) refused = MakeRoomLocked(req, &drop, &evicted);
    if (!refused.ok()) {
      on_refused = on_refused_;
    } else {
      e = std::make_shared<Entry>(req.key, req.model, req.inputs, req.source, std::move(req.files));
      e->reserved_bytes = req.bytes;
      e->check_digests = std::move(req.check_digests);
      e->taken_digests = std::move(req.taken_digests);
      entries_[req.key] = e;
      const uint64_t id = next_load_id_++;
      loads_.emplace(id, std::thread(&Registry::RunLoad, this, id, e, std::move(req.load)));
    }
    on_evict = on_evict_;
    observer = observer_;
  }
  NotifyEvicted(evicted, "budget", on_evict, observer);
  if (!refused.ok()) {
    if (on_refused) on_refused(req.model, device);
    return refused;
  }
  if (started != nullptr) *started = true;
  return e;
}

absl::Status Registry::MakeRoomLocked(const LoadRequest& req,
                                      std::vector<std::shared_ptr<const load::LoadedModel>>* drop,
                                      std::vector<std::shared_ptr<Entry>>* evicted) {
  const std::string& device = req.key.device_uuid;
  // What eviction cannot free (loading, leased, draining, and memory dropped that other
  // processes still hold): a request that cannot fit even after evicting everything else
  // fails before anything is evicted.
  const uint64_t lingering = lingering_ ? lingering_(device) : 0;
  uint64_t pinned = UsedLocked(&device) + lingering;
  for (const auto& [key, c] : entries_) {
    if (key.device_uuid == device && c->state == State::kReady && !Pinned(*c)) {
      pinned -= c->reserved_bytes;
    }
  }
  if (pinned + req.bytes > budget_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "model '", req.model, "' needs ", req.bytes, " bytes on ", device,
        "; its memory budget of ", budget_,
        " bytes cannot hold it even after evicting every "
        "unleased entry (",
        pinned, " bytes are loading, leased or draining",
        lingering == 0 ? std::string()
                       : absl::StrCat(", of which ", lingering,
                                      " bytes are evicted copies other processes still "
                                      "map or hold"),
        "); nothing was evicted"));
  }
  // LRU eviction of ready, unleased entries of the same device until the new one fits.
  while (UsedLocked(&device) + lingering + req.bytes > budget_) {
    std::shared_ptr<Entry> victim;
    for (const auto& [key, c] : entries_) {
      if (key.device_uuid == device && c->state == State::kReady && !Pinned(*c) &&
          (!victim || c->last_used < victim->last_used)) {
        victim = c;
      }
    }
    if (!victim) break;
    EvictLocked(victim->key, "budget", drop, evicted);
  }
  if (UsedLocked(&device) + lingering + req.bytes > budget_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "model '", req.model, "' needs ", req.bytes, " bytes on ", device, "; memory budget ",
        budget_, " bytes has ", budget_ - std::min(budget_, UsedLocked(&device) + lingering),
        " free after evicting every unleased entry of that device"));
  }
  return absl::OkStatus();
}

void Registry::RunLoad(uint64_t id, const std::shared_ptr<Entry>& e, const LoadFn& load) {
  auto t0 = std::chrono::steady_clock::now();
  auto result = load(*e);
  EntryObserver* observer = nullptr;
  DigestFn digester;
  DigestCheckFn check;
  TakenDigestsFn taken;
  {
    MutexLock l(mu_);
    observer = observer_;
    digester = digester_;
    check = e->check_digests;
    taken = e->taken_digests;
  }
  std::shared_ptr<const std::vector<integrity::SegmentDigest>> digests;
  if (result.ok() && digester && taken) {
    // Digested once per fill: what the load took (and checked) becomes the entry's.
    auto t = taken();
    if (!t.empty() && t.size() == (*result)->segments.size()) {
      digests = std::make_shared<const std::vector<integrity::SegmentDigest>>(std::move(t));
    }
  }
  if (result.ok() && digester && !digests) {
    auto d = digester(*e, **result);
    if (d.ok()) {
      digests = std::make_shared<const std::vector<integrity::SegmentDigest>>(std::move(d).value());
    } else {
      result = absl::Status(d.status().code(),
                            absl::StrCat("digest of the loaded segments: ", d.status().message()));
    }
  }
  if (result.ok() && digests && check) {
    if (absl::Status c = check(*digests); !c.ok()) result = c;
  }
  if (result.ok() && (*result)->content_id.empty()) (*result)->content_id = RandomHex(16);
  if (result.ok() && observer != nullptr) observer->BeforeReady(*e, **result);
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  absl::Status status = result.ok() ? absl::OkStatus() : result.status();
  LoadDoneFn done;
  {
    MutexLock l(mu_);
    e->load_seconds = secs;
    if (result.ok()) {
      e->loaded = std::shared_ptr<const load::LoadedModel>(std::move(result).value());
      e->reserved_bytes = e->loaded->resident_bytes();
      e->digests = std::move(digests);
      e->verified_at = std::chrono::steady_clock::now();
      e->state = State::kReady;
    } else {
      e->state = State::kFailed;
      e->error = status;
      e->reserved_bytes = 0;
    }
    e->last_used = std::chrono::steady_clock::now();
    done = on_done_;
  }
  // Logged before waiters wake, so the line precedes anything a woken Acquire causes
  // (tests and operators read the log in that order).
  if (status.ok()) {
    WC_LOG_INFO("model %s ready (fingerprint %s on %s, from %s) in %.3f s", e->model,
                e->fingerprint.substr(0, 12), e->device_uuid, e->source, secs);
  } else {
    WC_LOG_ERROR("model %s failed to load: %s", e->model, std::string(status.message()));
  }
  cv_.NotifyAll();
  if (done) done(*e, status, secs);
  MutexLock l(mu_);
  finished_loads_.push_back(id);  // the thread ends here; the next StartOrJoin joins it
}

State Registry::StateOf(const std::shared_ptr<Entry>& e) const {
  MutexLock l(mu_);
  return e->state;
}

void Registry::Stop() {
  {
    MutexLock l(mu_);
    stopping_ = true;
    for (const auto& [key, e] : entries_) {
      if (e->state == State::kLoading) e->progress.Cancel();
    }
  }
  cv_.NotifyAll();
}

absl::Status Registry::WaitReady(const std::shared_ptr<Entry>& e,
                                 std::chrono::steady_clock::time_point deadline,
                                 const std::function<bool()>& gone) {
  MutexLock l(mu_);
  while (e->state == State::kLoading && !stopping_) {
    if (!gone) {
      if (!cv_.WaitUntil(mu_, deadline)) break;
      continue;
    }
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) break;
    cv_.WaitUntil(mu_, std::min(deadline, now + kGoneCheck));
    if (e->state == State::kLoading && gone()) {
      return absl::CancelledError(
          absl::StrCat("model '", e->model, "': the caller went away while it was loading"));
    }
  }
  if (e->state == State::kLoading && stopping_) {
    return absl::CancelledError(
        absl::StrCat("model '", e->model, "': the daemon is shutting down; its load stopped"));
  }
  switch (e->state) {
    case State::kReady:
      return absl::OkStatus();
    case State::kFailed:
      return absl::Status(
          e->error.code() == absl::StatusCode::kOk ? absl::StatusCode::kInternal : e->error.code(),
          absl::StrCat("model '", e->model, "' failed to load: ", std::string(e->error.message())));
    case State::kLoading:
      return absl::DeadlineExceededError(absl::StrCat("model '", e->model, "' is still loading (",
                                                      e->progress.done(), " of ",
                                                      e->progress.total(), " bytes)"));
    default:
      return absl::UnavailableError(
          absl::StrCat("model '", e->model, "' was evicted (", StateName(e->state), ")"));
  }
}

std::shared_ptr<Entry> Registry::Find(const Key& key) const {
  MutexLock l(mu_);
  auto it = entries_.find(key);
  return it == entries_.end() ? nullptr : it->second;
}

std::vector<std::shared_ptr<Entry>> Registry::FindAll(const std::string& fingerprint) const {
  MutexLock l(mu_);
  std::vector<std::shared_ptr<Entry>> out;
  for (auto it = entries_.lower_bound(Key{fingerprint, ""});
       it != entries_.end() && it->first.fingerprint == fingerprint; ++it) {
    out.push_back(it->second);
  }
  return out;
}

std::vector<std::shared_ptr<Entry>> Registry::FindByModel(const std::string& model) const {
  MutexLock l(mu_);
  std::vector<std::shared_ptr<Entry>> out;
  for (const auto& [key, e] : entries_) {
    if (e->model == model) out.push_back(e);
  }
  return out;
}

absl::StatusOr<std::shared_ptr<const load::LoadedModel>> Registry::Content(
    const std::shared_ptr<Entry>& e) const {
  MutexLock l(mu_);
  if (e->state != State::kReady) {
    return absl::FailedPreconditionError(
        absl::StrCat("model '", e->model, "' is ", StateName(e->state)));
  }
  return e->loaded;
}

bool Registry::Discard(const std::shared_ptr<Entry>& e) {
  MutexLock l(mu_);
  auto it = entries_.find(e->key);
  if (it == entries_.end() || it->second != e || e->state != State::kFailed) return false;
  entries_.erase(it);
  e->state = State::kGone;
  return true;
}

void Registry::MarkStale(const std::shared_ptr<Entry>& e, const std::string& what) {
  MutexLock l(mu_);
  if (e->state == State::kReady && e->stale.empty()) {
    WC_LOG_WARN("model %s (%s) is stale: %s", e->model, e->key.ToString(), what);
  }
  e->stale = what;
}

Registry::Evicted Registry::EvictLocked(const Key& key, const std::string& reason,
                                        std::vector<std::shared_ptr<const load::LoadedModel>>* drop,
                                        std::vector<std::shared_ptr<Entry>>* evicted) {
  auto it = entries_.find(key);
  if (it == entries_.end() || it->second->state == State::kLoading) return Evicted::kNone;
  auto e = it->second;
  entries_.erase(it);
  evicted->push_back(e);
  // Leases whose descriptors were never claimed hold nothing: they end here.
  for (auto l = e->leases.begin(); l != e->leases.end();) {
    if (!l->second.claimed) {
      lease_to_entry_.erase(l->first);
      l = e->leases.erase(l);
    } else {
      ++l;
    }
  }
  if (!e->leases.empty()) {
    // Clients map it: keep it visible and counted until their leases end, but drop the
    // daemon's reference now, so the memory goes the moment the last client unmaps it.
    e->state = State::kDraining;
    // The daemon's serving reference goes; a watching one stays while it is not corrupt, so
    // the scrubber can tell its holders if it changes (the memory is theirs until they unmap).
    if (e->corrupt.empty()) e->watched = e->loaded;
    drop->push_back(std::move(e->loaded));
    draining_.push_back(e);
    WC_LOG_INFO("evicted model %s (%s, reason %s); draining: %d lease(s) still map it", e->model,
                key.ToString(), reason, e->leases.size());
    return Evicted::kDraining;
  }
  e->state = State::kEvicting;
  drop->push_back(std::move(e->loaded));
  e->reserved_bytes = 0;
  e->state = State::kGone;
  WC_LOG_INFO("evicted model %s (%s, reason %s)", e->model, key.ToString(), reason);
  return Evicted::kGone;
}

Registry::Evicted Registry::Evict(const Key& key, const std::string& reason) {
  std::vector<std::shared_ptr<const load::LoadedModel>> drop;
  std::vector<std::shared_ptr<Entry>> evicted;
  EvictFn on_evict;
  EntryObserver* observer = nullptr;
  Evicted result;
  {
    MutexLock l(mu_);
    result = EvictLocked(key, reason, &drop, &evicted);
    on_evict = on_evict_;
    observer = observer_;
  }
  cv_.NotifyAll();
  drop.clear();  // segments released here, outside the lock
  NotifyEvicted(evicted, reason, on_evict, observer);
  return result;
}

std::vector<EntrySnapshot> Registry::Snapshot() const {
  MutexLock l(mu_);
  std::vector<EntrySnapshot> out;
  auto now = std::chrono::steady_clock::now();
  std::vector<const Entry*> all;
  for (const auto& [key, e] : entries_) all.push_back(e.get());
  for (const auto& e : draining_) all.push_back(e.get());
  for (const Entry* e : all) {
    EntrySnapshot s;
    s.fingerprint = e->fingerprint;
    s.device_uuid = e->device_uuid;
    s.source = e->source;
    s.model = e->model;
    s.inputs = e->inputs;
    s.state = e->state;
    s.error = std::string(e->error.message());
    s.stale = e->stale;
    s.corrupt = e->corrupt;
    if (e->digests) {
      s.verified_seconds_ago = std::chrono::duration<double>(now - e->verified_at).count();
      for (const auto& d : *e->digests) s.segment_sha256.push_back(d.sha256);
    }
    s.bytes_done = e->progress.done();
    s.bytes_total = e->progress.total();
    s.current_file = e->progress.file();
    s.load_seconds = e->state == State::kLoading
                         ? std::chrono::duration<double>(now - e->started).count()
                         : e->load_seconds;
    if (e->state == State::kDraining) s.bytes = e->reserved_bytes;  // its reference is gone
    if (e->loaded) {
      s.bytes = e->loaded->resident_bytes();
      for (const auto& t : e->loaded->plan.tensors) s.tensor_bytes += t.nbytes;
      s.tensors = e->loaded->plan.tensors.size();
      s.segments = e->loaded->segments.size();
      s.bytes_read = e->loaded->stats.bytes_read;
    }
    for (const auto& [id, lease] : e->leases) s.leases.push_back(lease);
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace weightcache::cache
