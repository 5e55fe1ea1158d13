// Private: strict JSON parsing shared by the header and index readers.
// Thread-safety: free functions, no shared state; safe from any thread.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace weightcache::safetensors::internal {

// Deepest nesting a header or index may have (a header needs 3: object, entry, shape).
inline constexpr size_t kMaxJsonDepth = 32;

// Parses `text` as UTF-8 JSON: rejects ill-formed UTF-8 (naming the byte offset), nesting
// deeper than kMaxJsonDepth (before parsing: "[[[[..." costs nothing), syntax errors and
// duplicate object keys (which nlohmann would silently collapse). `what` is
// the subject of error messages, e.g. "model.safetensors: header". INVALID_ARGUMENT on any
// fault.
absl::StatusOr<nlohmann::json> ParseStrictJson(std::string_view text, const std::string& what);

// Compact one-line rendering of a JSON value for messages, e.g. [4,8].
std::string Brief(const nlohmann::json& value);

}  // namespace weightcache::safetensors::internal
