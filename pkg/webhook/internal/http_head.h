// How the webhook's front reads a request head (issue 56): where the request ends, by
// Content-Length only, or the answer that refuses the head. An AdmissionReview always carries
// Content-Length, so a chunked body, an Expect: header and a body-carrying request without a
// length are refused rather than read; header lines are held to RFC 9112 strictly enough that
// httplib, which parses the head again on a worker, cannot frame them otherwise.
//
// Thread-safety: pure functions, for any thread.
#pragma once

#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"

namespace weightcache::webhook::internal {

struct HeadVerdict {
  int status = 0;     // 0: taken; else the HTTP status that refuses the head
  std::string why;    // the refusal, for the client and the log (untrusted bytes escaped)
  uint64_t body = 0;  // the body's length, when taken
};

// Reads the head `head` (the bytes before its blank line):
//   400  a request line that is not METHOD TARGET VERSION; a header line without a name and
//        colon, with white space before the colon, folded, or holding a bare CR or LF; two
//        Content-Length headers; a Content-Length that is not a decimal number;
//   411  any Transfer-Encoding; a method other than GET or HEAD without Content-Length;
//   417  any Expect;
//   413  a Content-Length past `max_body_bytes`.
HeadVerdict ReadHead(absl::string_view head, uint64_t max_body_bytes);

// The whole answer that refuses a request: `status`, `why` as a text body, Connection: close.
std::string RefusalAnswer(int status, absl::string_view why);

}  // namespace weightcache::webhook::internal
