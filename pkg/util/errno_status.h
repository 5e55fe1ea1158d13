// Turning errno into absl::Status with the failing call and the subject named.
#pragma once

#include <string_view>

#include "absl/status/status.h"

namespace weightcache {

// e.g. ErrnoStatus(errno, "open", "/models/a.safetensors") ->
//   NOT_FOUND "open /models/a.safetensors: No such file or directory"
absl::Status ErrnoStatus(int err, std::string_view call, std::string_view subject = {});

}  // namespace weightcache
