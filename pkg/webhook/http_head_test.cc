// The front's reading of request heads (issue 56): what it takes, and each refusal's status and
// message. Pure function, no sockets.
#include "pkg/webhook/internal/http_head.h"

#include <gtest/gtest.h>

#include <string>

namespace weightcache::webhook::internal {
namespace {

constexpr uint64_t kMax = 4 << 20;

HeadVerdict Read(const std::string& head) { return ReadHead(head, kMax); }

TEST(HttpHeadTest, AReviewAndAProbeAreTaken) {
  HeadVerdict v = Read(
      "POST /mutate?timeout=5s HTTP/1.1\r\nHost: w.svc:443\r\ncontent-length:  1234 \r\n"
      "Content-Type: application/json");
  EXPECT_EQ(v.status, 0) << v.why;
  EXPECT_EQ(v.body, 1234u);
  v = Read("GET /healthz HTTP/1.1\r\nHost: 10.0.0.1:8443\r\nUser-Agent: kube-probe/1.29");
  EXPECT_EQ(v.status, 0) << v.why;
  EXPECT_EQ(v.body, 0u);
  v = Read("POST /mutate HTTP/1.1\r\nContent-Length: 4194304");
  EXPECT_EQ(v.status, 0) << v.why;
  EXPECT_EQ(v.body, kMax);
}

TEST(HttpHeadTest, ChunkedAndLengthlessBodiesAreRefused411) {
  HeadVerdict v = Read("POST /mutate HTTP/1.1\r\nTransfer-Encoding: chunked");
  EXPECT_EQ(v.status, 411);
  EXPECT_EQ(v.why,
            "Transfer-Encoding \"chunked\" refused: send the body whole, with Content-Length");
  // Both: the smuggling shape. Transfer-Encoding wins over any length.
  v = Read("POST /mutate HTTP/1.1\r\nContent-Length: 5\r\ntransfer-encoding: gzip, chunked");
  EXPECT_EQ(v.status, 411);
  v = Read("PUT /mutate HTTP/1.1\r\nHost: x");
  EXPECT_EQ(v.status, 411);
  EXPECT_EQ(v.why, "PUT without Content-Length refused: send the body with its length");
}

TEST(HttpHeadTest, ExpectIsRefused417) {
  HeadVerdict v = Read("POST /mutate HTTP/1.1\r\nContent-Length: 10\r\nExpect: 100-continue");
  EXPECT_EQ(v.status, 417);
  EXPECT_EQ(v.why,
            "Expect \"100-continue\" refused: send the body with the request, without Expect");
}

TEST(HttpHeadTest, ALengthPastTheLimitIsRefused413) {
  HeadVerdict v = Read("POST /mutate HTTP/1.1\r\nContent-Length: 4194305");
  EXPECT_EQ(v.status, 413);
  EXPECT_EQ(v.why, "request body of 4194305 bytes is larger than 4194304 bytes");
}

TEST(HttpHeadTest, MalformedHeadsAreRefused400) {
  struct Case {
    std::string head;
    std::string why;
  };
  const Case cases[] = {
      {"POST", "request line \"POST\" is not METHOD TARGET VERSION"},
      {" /mutate HTTP/1.1", "request line \" /mutate HTTP/1.1\" is not METHOD TARGET VERSION"},
      {"POST /mutate HTTP/1.1\r\nContent-Length : 5",
       "header line \"Content-Length : 5\" is not NAME: VALUE (no space before the colon, no "
       "folding, no bare CR or LF)"},
      {"POST /mutate HTTP/1.1\r\nX: a\r\n folded", "header line \" folded\" is not NAME: VALUE"},
      {"POST /mutate HTTP/1.1\r\nX: a\nContent-Length: 5",
       "header line \"X: a\\nContent-Length: 5\" is not NAME: VALUE"},
      {"POST /mutate HTTP/1.1\r\nno colon", "header line \"no colon\" is not NAME: VALUE"},
      {"POST /mutate HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 5",
       "more than one Content-Length header"},
      {"POST /mutate HTTP/1.1\r\nContent-Length: +5",
       "Content-Length \"+5\" is not a decimal number of bytes"},
      {"POST /mutate HTTP/1.1\r\nContent-Length: 5, 5",
       "Content-Length \"5, 5\" is not a decimal number of bytes"},
      {"POST /mutate HTTP/1.1\r\nContent-Length: 99999999999999999999",
       "Content-Length \"99999999999999999999\" is not a decimal number of bytes"},
  };
  for (const Case& c : cases) {
    const HeadVerdict v = Read(c.head);
    EXPECT_EQ(v.status, 400) << c.head;
    EXPECT_EQ(v.why.substr(0, c.why.size()), c.why) << c.head;
  }
}

TEST(HttpHeadTest, ARefusalIsAWholeAnswerThatCloses) {
  EXPECT_EQ(RefusalAnswer(411, "no length"),
            "HTTP/1.1 411 Length Required\r\nContent-Type: text/plain; charset=utf-8\r\n"
            "Content-Length: 10\r\nConnection: close\r\n\r\nno length\n");
  EXPECT_EQ(RefusalAnswer(503, "busy").find("HTTP/1.1 503 Service Unavailable\r\n"), 0u);
}

}  // namespace
}  // namespace weightcache::webhook::internal
