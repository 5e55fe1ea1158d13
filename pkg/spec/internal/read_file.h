// Reading a small text file (a spec, a config.json) whole. Thread-safe: no shared state.
#pragma once

#include <cstddef>
#include <string>

#include "absl/status/statusor.h"

namespace weightcache::spec::internal {

// Caps what a config file may hold, so a wrong path (a weights file) fails fast.
inline constexpr size_t kMaxTextFileBytes = 64 << 20;

// The file's bytes; errno errors name the call and the path ("open /m/config.json: No such
// file or directory" as NOT_FOUND); a FIFO, directory, device or socket is INVALID_ARGUMENT
// naming the type, without blocking (OpenRegularFile); a file above kMaxTextFileBytes is
// INVALID_ARGUMENT.
absl::StatusOr<std::string> ReadTextFile(const std::string& path);

}  // namespace weightcache::spec::internal
