// Pinned digests (spec `digests:`) when a model is opened: whether they name exactly the
// checkpoint's files, and each file's digest without a read; and at load time the check of
// the pins against the bytes the load reads (PinCheck). Not a public header.
// Thread-safety: the functions are pure (the store is thread-safe); PinCheck as it says.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "pkg/identity/following_hash.h"
#include "pkg/identity/identity.h"
#include "pkg/load/model.h"
#include "pkg/safetensors/safetensors.h"
#include "pkg/spec/spec.h"
#include "pkg/util/mutex.h"

namespace weightcache::load::internal {

// INVALID_ARGUMENT naming the model and every file at fault when the pins do not name exactly
// the checkpoint's files (a pin for a file not in it; a file without a pin). OK when none.
absl::Status CheckPinsCover(const spec::ModelSpec& spec, const safetensors::Checkpoint& ckpt);

// File `f` (at index `i` of the checkpoint, open as `fd`) identified by its pin: its stat, the
// pinned digest, source kPinned; or kStore when `store` (may be null) already knows this file
// version by the same SHA-256. DATA_LOSS naming both digests when the store knows it by another.
absl::StatusOr<SourceFile> PinnedSource(const spec::ModelSpec& spec, const std::string& name,
                                        const std::string& path, int fd,
                                        const identity::DigestStore* store);

// The pinned files of a model checked against the bytes a load of it reads, in the load's own
// pass (issue 58): set `tap()` as the load's LoadOptions::read_tap; each file's SHA-256
// follows the reads (identity::FollowingSha256), and Finish hashes what the load did not
// read (the headers, tensors no plan of this load needs, chunks read too far ahead) and
// compares. A file hashed whole during the load is compared at once: `on_mismatch` is called
// (once, from the reading thread) so the load can stop. Files whose pin this node confirmed
// before (digest source kStore) are not followed. What each file hashes to is recorded in
// the model's digest store.
// Thread-safety: the tap from the load's readers, concurrently; Finish once, after the load.
class PinCheck {
 public:
  // `hold_bytes`: chunks read ahead of a file's hash held aside (LoadOptions::pin_hold_bytes).
  static absl::StatusOr<std::unique_ptr<PinCheck>> Start(
      const OpenedModel& model, uint64_t hold_bytes,
      std::function<void(const absl::Status&)> on_mismatch);
  ~PinCheck();
  PinCheck(const PinCheck&) = delete;
  PinCheck& operator=(const PinCheck&) = delete;

  const safetensors::ReadTap* tap() const { return &tap_; }
  // DATA_LOSS (IsPinnedDigestMismatch) naming the model, the file and both digests when one
  // differs; UNAVAILABLE when a file changed since the model was opened; CANCELLED when
  // `cancel` turns true while it reads. What is left to read is read up to `threads` files
  // side by side.
  absl::Status Finish(const std::atomic<bool>* cancel, unsigned threads);
  uint64_t followed_bytes() const;  // hashed from the load's own reads
  uint64_t reread_bytes() const;    // read by the check itself
  uint64_t holes_filled() const;    // see FollowingSha256
  double room_wait_seconds() const;
  double hash_seconds() const;

 private:
  PinCheck() = default;
  void Checked(size_t k, const std::string& digest);
  absl::Status Compare(size_t k, const std::string& digest);

  const OpenedModel* model_ = nullptr;
  std::vector<size_t> followed_;  // checkpoint file index of each followed file
  std::unique_ptr<identity::FollowingSha256> hash_;
  safetensors::ReadTap tap_;
  std::function<void(const absl::Status&)> on_mismatch_;
  Mutex mu_;
  absl::Status early_ ABSL_GUARDED_BY(mu_);          // the first mismatch found during the load
  std::vector<bool> compared_ ABSL_GUARDED_BY(mu_);  // each followed file, once
};

}  // namespace weightcache::load::internal
