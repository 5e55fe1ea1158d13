// `weightcachectl pin MODEL`: the spec's `digests:` block for a model, from the content
// digests the daemon knows (Status, KnownModel.files: admins only). Thread-safety: pure.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "weightcache/v1/weightcache.pb.h"

namespace weightcache::ctl {

// YAML to paste under the model's spec (or its entry in the chart's values): a comment
// naming the model, then `digests:` with one `<file>: <64 hex>` line per checkpoint file,
// sorted by name. A file whose digest is only the spec's own pin (not read on this node) is
// printed with a comment saying so. NOT_FOUND when the daemon does not know `model`;
// FAILED_PRECONDITION when it refuses it (with why) or has not opened it yet, or shows no
// files (the caller is not an admin). Segment digests (`segment_digests:`) are printed only
// for entries this node loaded from its own disk (source "disk"), and it says so; any other
// ready entry (filled from peers, adopted from the keeper, published, copied between GPUs)
// is left out with a comment naming why, and when no entry came from disk, FAILED_PRECONDITION
// names each and why (a pin of a peer-filled copy would launder a forged one into the anchor).
absl::StatusOr<std::string> PinBlock(const v1::StatusResponse& status, const std::string& model);

}  // namespace weightcache::ctl
