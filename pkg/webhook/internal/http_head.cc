#include "pkg/webhook/internal/http_head.h"

#include <algorithm>
#include <string_view>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "pkg/util/untrusted_text.h"

namespace weightcache::webhook::internal {
namespace {

std::string Quote(absl::string_view text) {
  return QuoteTruncated(std::string_view(text.data(), text.size()));
}

bool AllDigits(absl::string_view s) {
  return std::all_of(s.begin(), s.end(),
                     [](char ch) { return absl::ascii_isdigit(static_cast<unsigned char>(ch)); });
}

const char* Reason(int status) {
  switch (status) {
    case 400:
      return "Bad Request";
    case 411:
      return "Length Required";
    case 413:
      return "Payload Too Large";
    case 417:
      return "Expectation Failed";
    case 431:
      return "Request Header Fields Too Large";
    default:
      return "Service Unavailable";
  }
}

}  // namespace

HeadVerdict ReadHead(absl::string_view head, uint64_t max_body_bytes) {
  size_t eol = head.find("\r\n");
  const absl::string_view request_line = head.substr(0, eol);
  const size_t space = request_line.find(' ');
  if (space == absl::string_view::npos || space == 0 ||
      request_line.find_first_of("\r\n") != absl::string_view::npos) {
    return {400,
            absl::StrCat("request line ", Quote(request_line), " is not METHOD TARGET VERSION")};
  }
  const absl::string_view method = request_line.substr(0, space);
  absl::string_view length, encoding, expect;
  bool has_length = false, has_encoding = false, has_expect = false;
  while (eol != absl::string_view::npos) {
    const size_t start = eol + 2;
    eol = head.find("\r\n", start);
    const absl::string_view line = head.substr(start, eol == head.npos ? head.npos : eol - start);
    const size_t colon = line.find(':');
    const absl::string_view name = line.substr(0, colon);
    if (colon == line.npos || name.empty() || name.find_first_of(" \t") != name.npos ||
        line.find_first_of("\r\n") != line.npos) {
      return {400, absl::StrCat("header line ", Quote(line),
                                " is not NAME: VALUE (no space before the colon, no folding, no "
                                "bare CR or LF)")};
    }
    const absl::string_view value = absl::StripAsciiWhitespace(line.substr(colon + 1));
    if (absl::EqualsIgnoreCase(name, "content-length")) {
      if (has_length) return {400, "more than one Content-Length header"};
      has_length = true;
      length = value;
    } else if (absl::EqualsIgnoreCase(name, "transfer-encoding")) {
      has_encoding = true;
      encoding = value;
    } else if (absl::EqualsIgnoreCase(name, "expect")) {
      has_expect = true;
      expect = value;
    }
  }
  if (has_encoding) {
    return {411, absl::StrCat("Transfer-Encoding ", Quote(encoding),
                              " refused: send the body whole, with Content-Length")};
  }
  if (has_expect) {
    return {417, absl::StrCat("Expect ", Quote(expect),
                              " refused: send the body with the request, without Expect")};
  }
  HeadVerdict taken;
  if (!has_length) {
    if (method == "GET" || method == "HEAD") return taken;
    return {411, absl::StrCat(EscapeTruncated(std::string_view(method.data(), method.size())),
                              " without Content-Length refused: send the body with its length")};
  }
  if (length.empty() || length.size() > 19 || !AllDigits(length) ||
      !absl::SimpleAtoi(length, &taken.body)) {
    return {400,
            absl::StrCat("Content-Length ", Quote(length), " is not a decimal number of bytes")};
  }
  if (taken.body > max_body_bytes) {
    return {413, absl::StrCat("request body of ", taken.body, " bytes is larger than ",
                              max_body_bytes, " bytes")};
  }
  return taken;
}

std::string RefusalAnswer(int status, absl::string_view why) {
  return absl::StrCat("HTTP/1.1 ", status, " ", Reason(status),
                      "\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: ",
                      why.size() + 1, "\r\nConnection: close\r\n\r\n", why, "\n");
}

}  // namespace weightcache::webhook::internal
