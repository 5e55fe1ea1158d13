// The HTTP/2 stream count the control relay closes connections by.
#include "pkg/server/internal/http2_streams.h"

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

}  // namespace
}  // namespace weightcache::server
