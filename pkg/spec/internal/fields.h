// What spec.cc (parsing) and validate.cc (validation) both write errors with. Not a public
// header. Thread-safety: pure functions.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "pkg/util/untrusted_text.h"

namespace weightcache::spec::internal {

// "<field>: <what>" as INVALID_ARGUMENT.
inline absl::Status Invalid(const std::string& field, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", what));
}

// Quotes a user-supplied value for an error message: escaped, and cut when long.
inline std::string Quote(const std::string& s) { return QuoteTruncated(s); }

}  // namespace weightcache::spec::internal
