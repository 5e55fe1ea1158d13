// The HTTP/2 stream count the control relay closes connections by.
#include "pkg/server/wire/http2_streams.h"

#include <string>

#include "gtest/gtest.h"
#include "tests/testutil/http2_frames.h"

namespace weightcache::server {
namespace {

using namespace weightcache::testing;

std::string Opening(int streams, uint32_t first = 1) {
  std::string out = kHttp2Preface;
  AppendHttp2Frame(out, kHttp2Settings, 0, 0, "");
  for (int i = 0; i < streams; ++i) {
    AppendHttp2Frame(out, kHttp2Headers, kHttp2EndHeaders, first + 2 * i,
                     GrpcRequestHeaderBlock("/weightcache.v1.Weightcache/Status"));
  }
  return out;
}

TEST(Http2StreamTrackerTest, CountsStreamsTheClientOpensWhateverTheChunking) {
  const std::string bytes = Opening(5);
  for (size_t chunk : {size_t{1}, size_t{7}, size_t{9}, bytes.size()}) {
    Http2StreamTracker t;
    for (size_t off = 0; off < bytes.size(); off += chunk) {
      t.FromClient(bytes.data() + off, std::min(chunk, bytes.size() - off));
    }
    EXPECT_EQ(t.open(), 5u) << "chunks of " << chunk;
  }
}

TEST(Http2StreamTrackerTest, ServerTrailersAndResetsInEitherDirectionEndStreams) {
  Http2StreamTracker t;
  const std::string bytes = Opening(4);
  t.FromClient(bytes.data(), bytes.size());
  std::string server;
  AppendHttp2Frame(server, kHttp2Settings, 0, 0, "");
  AppendHttp2Frame(server, kHttp2Headers, kHttp2EndHeaders, 1, "x");  // response headers
  t.FromServer(server.data(), server.size());
  EXPECT_EQ(t.open(), 4u);
  server.clear();
  AppendHttp2Frame(server, kHttp2Headers, kHttp2EndHeaders | kHttp2EndStream, 1, "y");
  AppendHttp2Frame(server, kHttp2RstStream, 0, 3, std::string(4, '\0'));
  t.FromServer(server.data(), server.size());
  EXPECT_EQ(t.open(), 2u);
  std::string client;
  AppendHttp2Frame(client, kHttp2RstStream, 0, 5, std::string(4, '\0'));
  // Trailers of the client on a stream it opened earlier open nothing new.
  AppendHttp2Frame(client, kHttp2Headers, kHttp2EndHeaders | kHttp2EndStream, 7, "z");
  t.FromClient(client.data(), client.size());
  EXPECT_EQ(t.open(), 1u);
}

TEST(Http2StreamTrackerTest, PayloadsAreSkippedNotParsed) {
  Http2StreamTracker t;
  std::string out = kHttp2Preface;
  // A DATA frame whose payload looks like a HEADERS frame header must not count.
  std::string fake;
  AppendHttp2Frame(fake, kHttp2Headers, kHttp2EndHeaders, 99, "");
  AppendHttp2Frame(out, 0x0, 0, 1, fake);
  t.FromClient(out.data(), out.size());
  EXPECT_EQ(t.open(), 0u);
}

TEST(Http2StreamTrackerTest, AHeaderBlockCountsUntilEndHeadersEmptyFramesToo) {
  Http2StreamTracker t;
  std::string out = kHttp2Preface;
  AppendHttp2Frame(out, kHttp2Headers, 0, 1, std::string(100, 'h'));  // no END_HEADERS
  t.FromClient(out.data(), out.size());
  EXPECT_EQ(t.header_block_bytes(), 109u);
  out.clear();
  for (int i = 0; i < 10; ++i) AppendHttp2Frame(out, kHttp2Continuation, 0, 1, "");
  AppendHttp2Frame(out, kHttp2Continuation, 0, 1, std::string(50, 'c'));
  // Counted from the frame header, before its payload has passed.
  t.FromClient(out.data(), out.size() - 50);
  EXPECT_EQ(t.header_block_bytes(), 109u + 10 * 9 + 59);
  t.FromClient(out.data() + out.size() - 50, 50);
  out.clear();
  AppendHttp2Frame(out, kHttp2Continuation, kHttp2EndHeaders, 1, "e");
  t.FromClient(out.data(), out.size());
  EXPECT_EQ(t.header_block_bytes(), 0u);  // ended
  // A CONTINUATION outside a block (a protocol error gRPC answers) counts nothing.
  out.clear();
  AppendHttp2Frame(out, kHttp2Continuation, 0, 1, std::string(10, 'x'));
  t.FromClient(out.data(), out.size());
  EXPECT_EQ(t.header_block_bytes(), 0u);
  EXPECT_EQ(t.open(), 1u);
}

TEST(Http2StreamTrackerTest, CountsTheResetsTheClientSends) {
  Http2StreamTracker t;
  std::string out = Opening(0);
  for (uint32_t s = 1; s < 200; s += 2) {
    AppendHttp2Frame(out, kHttp2Headers, kHttp2EndHeaders, s,
                     GrpcRequestHeaderBlock("/weightcache.v1.Weightcache/Status"));
    AppendHttp2Frame(out, kHttp2RstStream, 0, s, std::string(4, '\0'));
  }
  t.FromClient(out.data(), out.size());
  EXPECT_EQ(t.client_resets(), 100u);
  EXPECT_EQ(t.open(), 0u);  // never more than one open: the stream cap alone misses it
  std::string server;
  AppendHttp2Frame(server, kHttp2RstStream, 0, 201, std::string(4, '\0'));
  t.FromServer(server.data(), server.size());
  EXPECT_EQ(t.client_resets(), 100u);  // the server's resets are not the client's
}

}  // namespace
}  // namespace weightcache::server
