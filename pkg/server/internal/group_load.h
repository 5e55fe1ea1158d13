// One load for the ranks of a tensor-parallel group (load::LoadRanks reads each checkpoint
// byte once), shared by the ranks' registry entries: each entry's load function calls
// Take(its index); whichever runs first performs the group's load, the others wait for it
// and take their own rank's result. Not a public header.
//
// Membership is settled before anything is read: Admission starts every rank's entry, then
// calls Settle() with the ranks whose entries it started (a rank already loading or cached
// elsewhere, or refused by the budget, is dropped from the group and never allocated).
// Take() waits for Settle().
//
// Progress: the entry that runs the load passes its own progress to LoadRanks; the waiting
// entries mirror it (bytes done of the group's total) and forward a cancellation to it, so
// cancelling any rank's entry stops the group's load (every rank then fails CANCELLED).
// Once done, each entry's progress shows its own rank's source bytes (what the daemon counts
// as loaded for it), not the group's.
//
// Thread-safety: Settle and Take may be called from any thread.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "pkg/load/loader.h"
#include "pkg/util/mutex.h"

namespace weightcache::server {

class GroupLoad {
 public:
  // Loads the members (indices into the group, in order); returns their results in the same
  // order.
  using LoadFn = std::function<absl::StatusOr<std::vector<std::unique_ptr<load::LoadedModel>>>(
      const std::vector<size_t>& members, load::LoadProgress* progress)>;

  GroupLoad(size_t ranks, LoadFn load);

  // The ranks whose entries will call Take.
  void Settle(std::vector<bool> members);
  // Rank `index`'s result: runs the group's load when no other member has begun it.
  // `progress` is the calling entry's.
  absl::StatusOr<std::unique_ptr<load::LoadedModel>> Take(size_t index,
                                                          load::LoadProgress* progress);

 private:
  const size_t ranks_;
  const LoadFn load_;
  Mutex mu_;
  CondVar cv_;
  bool settled_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<bool> members_ ABSL_GUARDED_BY(mu_);
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  load::LoadProgress* runner_ ABSL_GUARDED_BY(mu_) = nullptr;  // while the load runs
  std::vector<std::unique_ptr<load::LoadedModel>> results_ ABSL_GUARDED_BY(mu_);  // by index
};

}  // namespace weightcache::server
