// Status propagation helpers. Debian's abseil (20220623) ships no RETURN_IF_ERROR /
// ASSIGN_OR_RETURN, so weightcache defines its own pair once, here.
// Thread-safety: macros only; no state.
#pragma once

#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define WC_CONCAT_INNER_(a, b) a##b
#define WC_CONCAT_(a, b) WC_CONCAT_INNER_(a, b)

// Returns from the current function with the status when `expr` is not OK.
#define WC_RETURN_IF_ERROR(expr)             \
  do {                                       \
    ::absl::Status wc_status_ = (expr);      \
    if (!wc_status_.ok()) return wc_status_; \
  } while (0)

// `lhs` = value of the StatusOr `rexpr`, or return its status.
#define WC_ASSIGN_OR_RETURN(lhs, rexpr) \
  WC_ASSIGN_OR_RETURN_IMPL_(WC_CONCAT_(wc_statusor_, __LINE__), lhs, rexpr)
// `lhs` may be a declaration ("auto x"), so it cannot be parenthesized.
// NOLINTBEGIN(bugprone-macro-parentheses)
#define WC_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, rexpr) \
  auto tmp = (rexpr);                              \
  if (!tmp.ok()) return std::move(tmp).status();   \
  lhs = std::move(tmp).value()
// NOLINTEND(bugprone-macro-parentheses)

namespace weightcache {

// Prefixes the message of a non-OK status with `context: `; keeps the code.
// Note: Debian's abseil has its own absl::string_view, distinct from std::string_view;
// pass std::string to absl APIs.
inline absl::Status Annotate(const absl::Status& s, const std::string& context) {
  if (s.ok()) return s;
  return absl::Status(s.code(), context + ": " + std::string(s.message()));
}

}  // namespace weightcache
