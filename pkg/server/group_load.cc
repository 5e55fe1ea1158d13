#include "pkg/server/internal/group_load.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "pkg/load/pieces.h"

namespace weightcache::server {
namespace {

// What an entry reports as loaded once the group is done: its own rank's source bytes, so
// that the entries of a group add up to what the cache received (not N times the group's).
void ReportOwnBytes(const load::LoadedModel& m, load::LoadProgress* progress) {
  uint64_t bytes = 0;
  for (const auto& t : m.plan.tensors) bytes += load::SourceBytes(t);
  progress->SetTotal(bytes);
  progress->SetDone(bytes);
}

}  // namespace

GroupLoad::GroupLoad(size_t ranks, LoadFn load) : ranks_(ranks), load_(std::move(load)) {}

void GroupLoad::Settle(std::vector<bool> members) {
  MutexLock l(mu_);
  members.resize(ranks_, false);
  members_ = std::move(members);
  settled_ = true;
  cv_.NotifyAll();
}

absl::StatusOr<std::unique_ptr<load::LoadedModel>> GroupLoad::Take(size_t index,
                                                                   load::LoadProgress* progress) {
  std::vector<size_t> members;
  {
    MutexLock l(mu_);
    while (!settled_) cv_.Wait(mu_);
    if (index >= ranks_ || !members_[index]) {
      return absl::InternalError(absl::StrCat("group load: rank ", index, " is not a member"));
    }
    if (started_) {
      // Another member runs the load: mirror its progress, forward a cancellation.
      while (!done_) {
        if (runner_ != nullptr) {
          progress->SetTotal(runner_->total());
          progress->SetDone(runner_->done());
          if (progress->cancelled()) runner_->Cancel();
        }
        cv_.WaitUntil(mu_, std::chrono::steady_clock::now() + std::chrono::milliseconds(50));
      }
      if (!status_.ok()) return status_;
      if (results_[index] == nullptr) {
        return absl::InternalError(absl::StrCat("group load: rank ", index, " taken twice"));
      }
      ReportOwnBytes(*results_[index], progress);
      return std::move(results_[index]);
    }
    started_ = true;
    runner_ = progress;
    for (size_t i = 0; i < ranks_; ++i) {
      if (members_[i]) members.push_back(i);
    }
  }
  auto loaded = load_(members, progress);
  MutexLock l(mu_);
  runner_ = nullptr;
  done_ = true;
  results_.resize(ranks_);
  if (loaded.ok() && loaded->size() != members.size()) {
    loaded = absl::InternalError("group load: result count differs from the members");
  }
  if (loaded.ok()) {
    for (size_t k = 0; k < members.size(); ++k) results_[members[k]] = std::move((*loaded)[k]);
  } else {
    status_ = loaded.status();
  }
  cv_.NotifyAll();
  if (!status_.ok()) return status_;
  ReportOwnBytes(*results_[index], progress);
  return std::move(results_[index]);
}

}  // namespace weightcache::server
