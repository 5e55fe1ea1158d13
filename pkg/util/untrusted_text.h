// Helpers for text that comes from outside (spec YAML, config.json, safetensors headers, RPC
// fields) and is echoed in error messages or parsed. Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace weightcache {

// Longest prefix of user input that an error message quotes.
inline constexpr size_t kMaxQuotedBytes = 128;

// `s` C-escaped (control bytes, quotes, backslashes and bytes above 0x7F as escapes), at most
// `max_bytes` bytes of it, between double quotes; a longer `s` is cut and its size noted:
//   QuoteTruncated("q_proj\0x")          -> "q_proj\000x"   (with the quotes)
//   QuoteTruncated(std::string(1e6,'a')) -> "aaaa...a"... (1000000 bytes)
// so that hostile input can neither forge a message's structure nor make it unbounded.
std::string QuoteTruncated(std::string_view s, size_t max_bytes = kMaxQuotedBytes);

// The same escaping and cut without the surrounding double quotes, for messages that quote
// names their own way ('name').
std::string EscapeTruncated(std::string_view s, size_t max_bytes = kMaxQuotedBytes);

// Byte offset of the first byte that is not part of well-formed UTF-8 (RFC 3629: no
// overlong forms, no surrogates, nothing above U+10FFFF), or npos when all of it is.
size_t FindInvalidUtf8(std::string_view s);

// Byte offset of the first control character of well-formed UTF-8 `s`: C0 (NUL, newline,
// escape...), DEL, or C1 (U+0080..U+009F, encoded C2 80..C2 9F); npos when there is none.
size_t FindControlChar(std::string_view s);

// Deepest nesting of brackets ([...], {...}) in JSON or YAML text, counted lexically:
// outside double- and single-quoted strings and '#' comments; the scan stops as soon as the
// depth exceeds `stop_above`, so it is cheap on hostile input. Run it before a parser builds
// anything, so that "[[[[..." is refused before it costs memory. It does not validate:
// a bracket inside a YAML plain scalar counts too (an overestimate), and text after a
// character that is invalid JSON may be counted short (a JSON parser stops there).
size_t BracketNestingDepth(std::string_view text, size_t stop_above);

}  // namespace weightcache
