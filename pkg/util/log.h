// Minimal leveled logging to stderr, one line per call, safe from any thread.
// Debian's abseil 20220623 has no absl/log; this is the small stand-in.
#pragma once

#include <string_view>

#include "absl/strings/str_format.h"

namespace weightcache {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };

void SetLogLevel(LogLevel level);
bool LogEnabled(LogLevel level);
void LogLine(LogLevel level, std::string_view msg);

template <typename... Args>
void Logf(LogLevel level, const absl::FormatSpec<Args...>& fmt, const Args&... args) {
  if (LogEnabled(level)) LogLine(level, absl::StrFormat(fmt, args...));
}

// An impossible internal state: print and abort (bugs, not bad input).
[[noreturn]] void CheckFailed(const char* file, int line, const char* cond);

}  // namespace weightcache

#define WC_LOG_INFO(...) ::weightcache::Logf(::weightcache::LogLevel::kInfo, __VA_ARGS__)
#define WC_LOG_WARN(...) ::weightcache::Logf(::weightcache::LogLevel::kWarning, __VA_ARGS__)
#define WC_LOG_ERROR(...) ::weightcache::Logf(::weightcache::LogLevel::kError, __VA_ARGS__)
#define WC_LOG_DEBUG(...) ::weightcache::Logf(::weightcache::LogLevel::kDebug, __VA_ARGS__)
#define WC_CHECK(cond) ((cond) ? (void)0 : ::weightcache::CheckFailed(__FILE__, __LINE__, #cond))
