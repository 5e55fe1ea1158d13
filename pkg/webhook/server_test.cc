// The webhook's HTTPS server under slow clients (issue 47), over real TLS on 127.0.0.1.
#include "pkg/webhook/server.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "pkg/webhook/testing/load.h"
#include "tests/testutil/temp_dir.h"

namespace weightcache::webhook {
namespace {

using testing::SlowClients;
using testing::TimeReview;

std::unique_ptr<Server> StartServer(const weightcache::testing::TempDir& dir,
                                    ServerOptions o = {}) {
  EXPECT_TRUE(testing::WriteSelfSignedPair(dir.path()).ok());
  o.address = "127.0.0.1:0";
  o.cert_file = dir / "tls.crt";
  o.key_file = dir / "tls.key";
  absl::StatusOr<std::unique_ptr<Server>> server = Server::Start(o);
  EXPECT_TRUE(server.ok()) << server.status();
  return server.ok() ? *std::move(server) : nullptr;
}

// Finding (issue 47): 128 slow TLS clients that reconnect pushed a good review to 5.2-8.1 s
// on a busy 2-core machine (the API server gives up at 5 s and, with failurePolicy Ignore,
// admits the pod unmutated). Each connection held one of the 32 request threads from its
// accept, TLS handshake included, until the 3 s connection deadline, and the listen backlog
// was httplib's 5; a review queued behind them waited at least one deadline. Now the
// accepting thread does the handshakes, so no review waits for a slow client's deadline.
// The slow clients are let cycle once (each closed and reconnected) before the reviews. The
// bound: 20 times the slowest review on the idle server (what the machine allows), at least
// 500 ms, and never more than half the 3 s deadline that the old code made every review
// wait; docs/benchmarks.md has the 1 s target measured (webhook_bench).
TEST(ServerTest, GoodReviewsAreAnsweredBeside128SlowReconnectingClients) {
  weightcache::testing::TempDir dir;
  std::unique_ptr<Server> server = StartServer(dir);
  ASSERT_NE(server, nullptr);
  constexpr int kReviews = 20;
  absl::Duration idle_max;
  for (int i = 0; i < kReviews; ++i) {
    absl::StatusOr<absl::Duration> took = TimeReview(server->port(), absl::Seconds(10));
    ASSERT_TRUE(took.ok()) << "idle: " << took.status();
    idle_max = std::max(idle_max, *took);
  }
  const absl::Duration bound =
      std::min(std::max(20 * idle_max, absl::Milliseconds(500)), absl::Milliseconds(1500));

  SlowClients slow(server->port(), 128);
  ASSERT_TRUE(slow.WaitConnected(2, absl::Seconds(60)));
  std::vector<absl::Duration> loaded;
  for (int i = 0; i < kReviews; ++i) {
    absl::StatusOr<absl::Duration> took = TimeReview(server->port(), bound);
    ASSERT_TRUE(took.ok()) << "review " << i << " beside 128 slow clients, bound "
                           << absl::FormatDuration(bound) << " (idle max "
                           << absl::FormatDuration(idle_max) << "): " << took.status();
    loaded.push_back(*took);
  }
  std::sort(loaded.begin(), loaded.end());
  std::printf("idle max %s; beside 128 slow clients: p50 %s max %s (bound %s), %lld connects\n",
              absl::FormatDuration(idle_max).c_str(),
              absl::FormatDuration(loaded[kReviews / 2]).c_str(),
              absl::FormatDuration(loaded.back()).c_str(), absl::FormatDuration(bound).c_str(),
              static_cast<long long>(slow.connects()));
}

// Whether the server closed `fd` within `within`.
bool ClosedWithin(int fd, absl::Duration within) {
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(within))) != 1) return false;
  char byte;
  return ::recv(fd, &byte, 1, 0) <= 0;
}

// A client that connects and never sends its ClientHello is closed at the handshake timeout,
// not held for the connection deadline.
TEST(ServerTest, ASilentHandshakeIsClosedAtItsTimeout) {
  weightcache::testing::TempDir dir;
  ServerOptions o;
  o.handshake_timeout_ms = 200;
  o.connection_deadline_ms = 60000;
  std::unique_ptr<Server> server = StartServer(dir, o);
  ASSERT_NE(server, nullptr);
  const int fd = testing::ConnectFrom("127.0.0.2", server->port());
  ASSERT_GE(fd, 0);
  const absl::Time start = absl::Now();
  EXPECT_TRUE(ClosedWithin(fd, absl::Seconds(30)));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(150));
  ::close(fd);
  EXPECT_EQ(server->connection_stats().handshake_timeouts, 1u);
}

// One address holds at most max_connections_per_source connections: one more is closed at
// once, and a client from another address (the API server) is still served.
TEST(ServerTest, ConnectionsPastTheSourceLimitAreClosedAndOthersServed) {
  weightcache::testing::TempDir dir;
  ServerOptions o;
  o.max_connections_per_source = 4;
  o.handshake_timeout_ms = 60000;
  std::unique_ptr<Server> server = StartServer(dir, o);
  ASSERT_NE(server, nullptr);
  std::vector<int> held;
  for (int i = 0; i < 4; ++i) {
    held.push_back(testing::ConnectFrom("127.0.0.3", server->port()));
    ASSERT_GE(held.back(), 0);
  }
  const int extra = testing::ConnectFrom("127.0.0.3", server->port());
  ASSERT_GE(extra, 0);
  EXPECT_TRUE(ClosedWithin(extra, absl::Seconds(30)));
  ::close(extra);
  for (int fd : held) EXPECT_FALSE(ClosedWithin(fd, absl::Milliseconds(1)));
  absl::StatusOr<absl::Duration> took = TimeReview(server->port(), absl::Seconds(30));
  EXPECT_TRUE(took.ok()) << took.status();
  EXPECT_EQ(server->connection_stats().source_refusals, 1u);
  for (int fd : held) ::close(fd);
}

// The front reads requests itself: keep-alive connections carry several reviews, and a
// request whose body comes after "Expect: 100-continue" or in chunks is still served.
TEST(ServerTest, KeepAliveAndChunkedRequestsAreServed) {
  weightcache::testing::TempDir dir;
  std::unique_ptr<Server> server = StartServer(dir);
  ASSERT_NE(server, nullptr);
  httplib::SSLClient client("127.0.0.1", server->port());
  client.enable_server_certificate_verification(false);
  client.set_keep_alive(true);
  for (int i = 0; i < 3; ++i) {
    httplib::Result res = client.Post("/mutate", testing::GoodReview(), "application/json");
    ASSERT_TRUE(res) << httplib::to_string(res.error());
    EXPECT_EQ(res->status, 200);
    EXPECT_NE(res->body.find("\"patch\""), std::string::npos) << res->body;
  }
  EXPECT_EQ(server->connection_stats().accepted, 1u);
  EXPECT_EQ(server->connection_stats().requests, 3u);
  const std::string body = testing::GoodReview();
  httplib::Result chunked = client.Post(
      "/mutate",
      [&](size_t offset, httplib::DataSink& sink) {
        if (offset < body.size()) {
          sink.write(body.data() + offset, std::min<size_t>(100, body.size() - offset));
        } else {
          sink.done();
        }
        return true;
      },
      "application/json");
  ASSERT_TRUE(chunked) << httplib::to_string(chunked.error());
  EXPECT_EQ(chunked->status, 200);
  EXPECT_NE(chunked->body.find("\"patch\""), std::string::npos) << chunked->body;
}

}  // namespace
}  // namespace weightcache::webhook
