// Registry: what integrity scrubbing reads and marks (digests, the entries to check,
// corruption), apart from loading and eviction.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "pkg/cache/registry.h"
#include "pkg/util/log.h"

namespace weightcache::cache {

void Registry::SetDigester(DigestFn fn) {
  MutexLock l(mu_);
  digester_ = std::move(fn);
}

std::vector<std::shared_ptr<Entry>> Registry::ReadyEntries() const {
  MutexLock l(mu_);
  std::vector<std::shared_ptr<Entry>> out;
  for (const auto& [key, e] : entries_) {
    if (e->state == State::kReady) out.push_back(e);
  }
  return out;
}

std::vector<std::shared_ptr<Entry>> Registry::WatchedEntries() const {
  MutexLock l(mu_);
  std::vector<std::shared_ptr<Entry>> out;
  for (const auto& [key, e] : entries_) {
    if (e->state == State::kReady) out.push_back(e);
  }
  for (const auto& e : draining_) {
    if (e->watched != nullptr) out.push_back(e);
  }
  return out;
}

absl::StatusOr<std::shared_ptr<const load::LoadedModel>> Registry::WatchedContent(
    const std::shared_ptr<Entry>& e) const {
  MutexLock l(mu_);
  if (e->state == State::kReady && e->loaded != nullptr) return e->loaded;
  if (e->state == State::kDraining && e->watched != nullptr) return e->watched;
  return absl::FailedPreconditionError(
      absl::StrCat("model ", e->model, " (", e->key.ToString(), ") is ", StateName(e->state),
                   e->corrupt.empty() ? "" : " and corrupt", ": nothing to check"));
}

std::shared_ptr<const std::vector<integrity::SegmentDigest>> Registry::Digests(
    const std::shared_ptr<Entry>& e) const {
  MutexLock l(mu_);
  return e->digests;
}

std::vector<std::string> Registry::LeaseIds(const std::shared_ptr<Entry>& e) const {
  MutexLock l(mu_);
  std::vector<std::string> out;
  for (const auto& [id, lease] : e->leases) out.push_back(id);
  return out;
}

void Registry::MarkVerified(const std::shared_ptr<Entry>& e) {
  MutexLock l(mu_);
  e->verified_at = std::chrono::steady_clock::now();
}

Registry::Evicted Registry::MarkCorrupt(const std::shared_ptr<Entry>& e, const std::string& what,
                                        State* was) {
  std::vector<std::shared_ptr<const load::LoadedModel>> drop;
  std::vector<std::shared_ptr<Entry>> evicted;
  EvictFn on_evict;
  EntryObserver* observer = nullptr;
  Evicted result = Evicted::kNone;
  {
    MutexLock l(mu_);
    if (was != nullptr) *was = e->state;
    const bool first = e->corrupt.empty();
    e->corrupt = what;
    auto it = entries_.find(e->key);
    if (it != entries_.end() && it->second == e) {
      result = EvictLocked(e->key, "corrupt", &drop, &evicted);
    } else if (e->state == State::kDraining && first) {
      drop.push_back(std::move(e->watched));  // freed when its holders unmap it
      result = Evicted::kDraining;
    }
    on_evict = on_evict_;
    observer = observer_;
  }
  cv_.NotifyAll();
  drop.clear();
  NotifyEvicted(evicted, "corrupt", on_evict, observer);
  return result;
}

}  // namespace weightcache::cache
