#include "pkg/util/size_flag.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace weightcache {

absl::StatusOr<uint64_t> ParseByteSize(const std::string& text, const std::string& what) {
  auto bad = [&] {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": '", text, "' is not a size (use e.g. 0, 1048576, 64MiB, 120GiB, 1.5TB)"));
  };
  std::string t(absl::StripAsciiWhitespace(text));
  if (t.empty()) return bad();
  char* end = nullptr;
  double v = std::strtod(t.c_str(), &end);
  if (end == t.c_str() || !std::isfinite(v) || v < 0) return bad();
  std::string suffix = absl::AsciiStrToLower(absl::StripAsciiWhitespace(std::string(end)));
  if (!suffix.empty() && suffix.back() == 'b') suffix.pop_back();
  double mult;
  if (suffix.empty())
    mult = 1;
  else if (suffix == "ki")
    mult = 1024.0;
  else if (suffix == "mi")
    mult = 1024.0 * 1024;
  else if (suffix == "gi")
    mult = 1024.0 * 1024 * 1024;
  else if (suffix == "ti")
    mult = 1024.0 * 1024 * 1024 * 1024;
  else if (suffix == "k")
    mult = 1e3;
  else if (suffix == "m")
    mult = 1e6;
  else if (suffix == "g")
    mult = 1e9;
  else if (suffix == "t")
    mult = 1e12;
  else
    return bad();
  double bytes = v * mult;
  if (bytes >= 1.8e19) return bad();
  return static_cast<uint64_t>(std::llround(bytes));
}

absl::StatusOr<uint64_t> ParseByteSizeOrShare(const std::string& text, uint64_t whole,
                                              const std::string& what) {
  std::string t(absl::StripAsciiWhitespace(text));
  if (t.empty() || t.back() != '%') return ParseByteSize(text, what);
  t.pop_back();
  char* end = nullptr;
  const double pct = std::strtod(t.c_str(), &end);
  if (t.empty() || end != t.c_str() + t.size() || !std::isfinite(pct) || pct <= 0 || pct > 100) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": '", text, "' is not a percentage in (0, 100] (use e.g. 90%) nor a size"));
  }
  return static_cast<uint64_t>(static_cast<double>(whole) * pct / 100.0);
}

std::string FormatBytes(uint64_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.2f %s", v, kUnits[u]);
  return buf;
}

}  // namespace weightcache
