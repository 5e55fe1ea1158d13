#include "pkg/util/untrusted_text.h"

#include <algorithm>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace weightcache {

std::string EscapeTruncated(std::string_view s, size_t max_bytes) {
  // Debian's abseil has its own absl::string_view: go through std::string.
  if (s.size() <= max_bytes) return absl::CEscape(std::string(s));
  return absl::StrCat(absl::CEscape(std::string(s.substr(0, max_bytes))), "...");
}

std::string QuoteTruncated(std::string_view s, size_t max_bytes) {
  std::string out = absl::StrCat("\"", EscapeTruncated(s, max_bytes), "\"");
  if (s.size() > max_bytes) absl::StrAppend(&out, " (", s.size(), " bytes)");
  return out;
}

size_t FindInvalidUtf8(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    const unsigned char c = p[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len;
    unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
    if (c >= 0xC2 && c <= 0xDF) {
      len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      if (c == 0xE0) lo = 0xA0;  // overlong
      if (c == 0xED) hi = 0x9F;  // surrogates
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      if (c == 0xF0) lo = 0x90;  // overlong
      if (c == 0xF4) hi = 0x8F;  // above U+10FFFF
    } else {
      return i;  // continuation byte, overlong lead (C0, C1) or F5..FF
    }
    if (i + len > n) return i;
    if (p[i + 1] < lo || p[i + 1] > hi) return i;
    for (size_t k = 2; k < len; ++k) {
      if (p[i + k] < 0x80 || p[i + k] > 0xBF) return i;
    }
    i += len;
  }
  return std::string_view::npos;
}

size_t FindControlChar(std::string_view s) {
  for (size_t i = 0; i < s.size(); ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c == 0x7F) return i;
    if (c == 0xC2 && i + 1 < s.size() && static_cast<unsigned char>(s[i + 1]) <= 0x9F) return i;
  }
  return std::string_view::npos;
}

size_t BracketNestingDepth(std::string_view text, size_t stop_above) {
  size_t depth = 0;
  size_t deepest = 0;
  char quote = 0;  // the open string's quote
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (quote == '"') {
      if (c == '\\') {
        ++i;  // the escaped character cannot end the string
      } else if (c == '"') {
        quote = 0;
      }
      continue;
    }
    if (quote == '\'') {
      if (c == '\'') quote = 0;  // YAML's '' (a quote) leaves and re-enters at once
      continue;
    }
    switch (c) {
      case '"':
      case '\'':
        quote = c;
        break;
      case '#':  // a YAML comment starts at a line start or after a blank
        if (i == 0 || text[i - 1] == ' ' || text[i - 1] == '\t' || text[i - 1] == '\n') {
          i = std::min(text.find('\n', i), text.size());
        }
        break;
      case '[':
      case '{':
        deepest = std::max(deepest, ++depth);
        if (deepest > stop_above) return deepest;
        break;
      case ']':
      case '}':
        if (depth > 0) --depth;
        break;
      default:
        break;
    }
  }
  return deepest;
}

}  // namespace weightcache
