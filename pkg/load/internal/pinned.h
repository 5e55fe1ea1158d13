// Pinned digests (spec `digests:`) when a model is opened: whether they name exactly the
// checkpoint's files, and each file's digest without a read. Not a public header; the check
// against the bytes at load time is load::VerifyPinned (model.h).
// Thread-safety: pure functions of their arguments (and the store, which is thread-safe).
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "pkg/identity/identity.h"
#include "pkg/load/model.h"
#include "pkg/safetensors/safetensors.h"
#include "pkg/spec/spec.h"

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

}  // namespace weightcache::load::internal
