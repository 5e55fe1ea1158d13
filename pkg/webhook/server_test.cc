// The webhook's HTTPS server under slow clients (issues 47, 56), over real TLS on 127.0.0.1.
#include "pkg/webhook/server.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "pkg/webhook/testing/load.h"
#include "tests/testutil/temp_dir.h"

namespace weightcache::webhook {
namespace {

using testing::SlowClients;
using testing::TimeReview;
using testing::TlsClient;

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

// Times `reviews` reviews on the idle server: `idle_max` is the slowest (what the machine
// allows), and `bound` 20 times that, within [floor, cap].
void BoundFromIdleReviews(const Server& server, int reviews, absl::Duration floor,
                          absl::Duration cap, absl::Duration& idle_max, absl::Duration& bound) {
  for (int i = 0; i < reviews; ++i) {
    absl::StatusOr<absl::Duration> took = TimeReview(server.port(), absl::Seconds(10));
    ASSERT_TRUE(took.ok()) << "idle: " << took.status();
    idle_max = std::max(idle_max, *took);
  }
  bound = std::min(std::max(20 * idle_max, floor), cap);
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
  absl::Duration idle_max, bound;
  ASSERT_NO_FATAL_FAILURE(BoundFromIdleReviews(*server, kReviews, absl::Milliseconds(500),
                                               absl::Milliseconds(1500), idle_max, bound));

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

// The webhook accepts through the acceptor (pkg/net): at max_connections in all, a newcomer
// takes the place of the connection longest in its TLS handshake (none of those carries a
// review yet), so clients stalled mid-handshake cannot keep the API server out. On the old
// accept loop the newcomer waited in the backlog until a stalled handshake timed out (5 s
// here, past the bound: 20 times the idle review, within [500 ms, 1.5 s]).
TEST(ServerTest, AcceptorGivesAReviewTheRoomOfAStalledHandshake) {
  ServerOptions o;
  o.max_connections = 8;  // all held by stalled handshakes below
  o.handshake_timeout_ms = 5000;
  weightcache::testing::TempDir dir;
  std::unique_ptr<Server> server = StartServer(dir, o);
  ASSERT_NE(server, nullptr);
  absl::Duration idle_max, bound;
  ASSERT_NO_FATAL_FAILURE(BoundFromIdleReviews(*server, 5, absl::Milliseconds(500),
                                               absl::Milliseconds(1500), idle_max, bound));
  const uint64_t before = server->connection_stats().accepted;
  std::vector<int> stalled;
  for (int i = 0; i < 8; ++i) {
    stalled.push_back(testing::ConnectFrom("127.0.0.4", server->port()));
    ASSERT_GE(stalled.back(), 0);
    ASSERT_EQ(::send(stalled.back(), "\x16", 1, MSG_NOSIGNAL), 1);  // a record begins, no more
  }
  // All eight hold their places once the loop has taken them.
  while (server->connection_stats().accepted < before + 8) std::this_thread::yield();
  absl::StatusOr<absl::Duration> took = TimeReview(server->port(), bound);
  EXPECT_TRUE(took.ok()) << "bound " << absl::FormatDuration(bound) << " (idle max "
                         << absl::FormatDuration(idle_max) << "): " << took.status();
  EXPECT_EQ(server->connection_stats().total_refusals, 1u);
  int closed = 0;
  for (int fd : stalled) closed += ClosedWithin(fd, absl::Milliseconds(1)) ? 1 : 0;
  EXPECT_EQ(closed, 1);  // the oldest one, and only it
  for (int fd : stalled) ::close(fd);
}

// The front reads requests itself: keep-alive connections carry several reviews, each answered
// on the connection it came on.
TEST(ServerTest, KeepAliveRequestsAreServed) {
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
}

// Options under which a request head handed to a worker (the old front) holds it for a minute:
// a test that reads its answer within seconds sees whether the loop answered it.
ServerOptions PatientOptions() {
  ServerOptions o;
  o.connection_deadline_ms = 60000;
  o.request_timeout_ms = 60000;
  o.num_threads = 2;
  return o;
}

// Sends `head` (no body) on a fresh TLS connection from 127.0.0.2 and returns what the server
// answered before it closed the connection; "" when it did not close within 10 s.
std::string AnswerToHead(const Server& server, const std::string& head) {
  std::unique_ptr<TlsClient> client =
      TlsClient::Connect("127.0.0.2", server.port(), absl::Seconds(30));
  if (client == nullptr || !client->Send(head)) return "no connection";
  bool closed = false;
  std::string answer = client->Receive(absl::Seconds(10), closed);
  return closed ? answer : "";
}

// Sends `head` on 4 connections (twice the workers of PatientOptions) and expects each answered
// `status_line` with `message` by the loop, with no request handed to a worker; then a review is
// still served.
void ExpectAnsweredByTheLoop(const std::string& head, const std::string& status_line,
                             const std::string& message) {
  weightcache::testing::TempDir dir;
  std::unique_ptr<Server> server = StartServer(dir, PatientOptions());
  ASSERT_NE(server, nullptr);
  for (int i = 0; i < 4; ++i) {
    const std::string answer = AnswerToHead(*server, head);
    ASSERT_TRUE(absl::StartsWith(answer, status_line)) << answer;
    EXPECT_TRUE(absl::StrContains(answer, message)) << answer;
  }
  EXPECT_EQ(server->connection_stats().refused_heads, 4u);
  EXPECT_EQ(server->connection_stats().requests, 0u);
  absl::StatusOr<absl::Duration> took = TimeReview(server->port(), absl::Seconds(30));
  EXPECT_TRUE(took.ok()) << took.status();
}

// Finding (issue 56): a head with Transfer-Encoding: chunked went to a worker, which waited for
// chunks until the connection deadline; 32 such heads held every worker. An AdmissionReview
// always carries Content-Length, so the loop answers 411 at the head and closes.
TEST(ServerTest, ChunkedHeadsAreAnswered411ByTheLoopWithoutAWorker) {
  ExpectAnsweredByTheLoop(
      "POST /mutate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
      "Transfer-Encoding: chunked\r\n\r\n",
      "HTTP/1.1 411 Length Required\r\n",
      "Transfer-Encoding \"chunked\" refused: send the body whole, with Content-Length");
}

// Finding (issue 56): a head with Expect: 100-continue went to a worker, which answered 100 and
// waited for the body until the connection deadline. The loop answers 417 at the head.
TEST(ServerTest, ExpectHeadsAreAnswered417ByTheLoopWithoutAWorker) {
  ExpectAnsweredByTheLoop(
      "POST /mutate HTTP/1.1\r\nHost: localhost\r\nContent-Length: 1000\r\n"
      "Expect: 100-continue\r\n\r\n",
      "HTTP/1.1 417 Expectation Failed\r\n",
      "Expect \"100-continue\" refused: send the body with the request, without Expect");
}

// Finding (issue 56): a Content-Length past the body limit (the old front read bodies over
// 1 MiB on a worker, and httplib read a too-large body to skip it) and a POST without any
// length (httplib read it to the end of the stream) are answered by the loop at the head.
TEST(ServerTest, BodiesPastTheLimitOrWithoutLengthAreAnsweredByTheLoopWithoutAWorker) {
  weightcache::testing::TempDir dir;
  ServerOptions o = PatientOptions();
  o.max_body_bytes = 2 << 20;
  std::unique_ptr<Server> server = StartServer(dir, o);
  ASSERT_NE(server, nullptr);
  std::string answer = AnswerToHead(
      *server, "POST /mutate HTTP/1.1\r\nHost: localhost\r\nContent-Length: 2097153\r\n\r\n");
  EXPECT_TRUE(absl::StartsWith(answer, "HTTP/1.1 413 Payload Too Large\r\n")) << answer;
  EXPECT_TRUE(
      absl::StrContains(answer, "request body of 2097153 bytes is larger than 2097152 bytes"))
      << answer;
  answer = AnswerToHead(*server, "POST /mutate HTTP/1.1\r\nHost: localhost\r\n\r\n");
  EXPECT_TRUE(absl::StartsWith(answer, "HTTP/1.1 411 Length Required\r\n")) << answer;
  EXPECT_TRUE(absl::StrContains(answer, "POST without Content-Length refused")) << answer;
  answer = AnswerToHead(*server,
                        "POST /mutate HTTP/1.1\r\nHost: localhost\r\nContent-Length : 10\r\n\r\n");
  EXPECT_TRUE(absl::StartsWith(answer, "HTTP/1.1 400 Bad Request\r\n")) << answer;
  EXPECT_TRUE(absl::StrContains(answer, "is not NAME: VALUE")) << answer;
  EXPECT_EQ(server->connection_stats().refused_heads, 3u);
  EXPECT_EQ(server->connection_stats().requests, 0u);
}

// Finding (issue 56): from 4 addresses x 256 connections that sent a head announcing a large
// body and then nothing, good reviews took 2.4-3.8 s (6 addresses: 4.4-6.9 s, past the API
// server's 5 s timeout): the old front handed a head whose body was over 1 MiB to a worker,
// which waited for the body. Now bodies are read in the loop, so the stalled heads cost
// descriptors and buffered heads only. 8 addresses x 256 (the per-address cap) here; the
// connection deadline is a minute so that they stay for the whole test, and max_connections
// holds them all (the total cap is the acceptor's concern, not this attack's). The stalled
// clients come from 127.0.0.2-9, the good client from 127.0.0.1 (httplib binds no source).
// The bound: 20 times the slowest review on the idle server (what the machine allows), at least
// 250 ms, and never more than the 1 s target; the old code misses it by the 60 s the
// workers wait.
TEST(ServerTest, StalledHeadsFrom8AddressesLeaveGoodReviewsUnder1s) {
  rlimit files{};
  ::getrlimit(RLIMIT_NOFILE, &files);
  files.rlim_cur = std::max<rlim_t>(files.rlim_cur, std::min<rlim_t>(files.rlim_max, 8192));
  ::setrlimit(RLIMIT_NOFILE, &files);
  if (files.rlim_cur < 8192)
    GTEST_SKIP() << "needs 8192 descriptors, RLIMIT_NOFILE is " << files.rlim_cur;
  weightcache::testing::TempDir dir;
  ServerOptions o;
  o.connection_deadline_ms = 60000;
  o.request_timeout_ms = 60000;
  o.handshake_timeout_ms = 60000;
  o.max_connections = 4096;
  std::unique_ptr<Server> server = StartServer(dir, o);
  ASSERT_NE(server, nullptr);
  constexpr int kReviews = 10;
  absl::Duration idle_max, bound;
  ASSERT_NO_FATAL_FAILURE(BoundFromIdleReviews(*server, kReviews, absl::Milliseconds(250),
                                               absl::Seconds(1), idle_max, bound));

  constexpr int kAddresses = 8;
  constexpr int kPerAddress = 256;
  const std::string head = absl::StrCat(
      "POST /mutate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
      "Content-Length: ",
      o.max_body_bytes, "\r\n\r\n");
  std::vector<std::vector<std::unique_ptr<TlsClient>>> stalled(kAddresses);
  std::vector<std::thread> openers;
  for (int a = 0; a < kAddresses; ++a) {
    openers.emplace_back([&, a] {
      const std::string source = absl::StrCat("127.0.0.", 2 + a);
      for (int i = 0; i < kPerAddress; ++i) {
        std::unique_ptr<TlsClient> c =
            TlsClient::Connect(source, server->port(), absl::Seconds(30));
        if (c == nullptr || !c->Send(head)) return;
        stalled[a].push_back(std::move(c));
      }
    });
  }
  for (std::thread& t : openers) t.join();
  for (int a = 0; a < kAddresses; ++a) ASSERT_EQ(stalled[a].size(), kPerAddress) << "address " << a;
  EXPECT_EQ(server->connection_stats().source_refusals, 0u);

  std::vector<absl::Duration> loaded;
  for (int i = 0; i < kReviews; ++i) {
    absl::StatusOr<absl::Duration> took = TimeReview(server->port(), bound);
    ASSERT_TRUE(took.ok()) << "review " << i << " beside " << kAddresses * kPerAddress
                           << " stalled heads, bound " << absl::FormatDuration(bound)
                           << " (idle max " << absl::FormatDuration(idle_max)
                           << "): " << took.status();
    loaded.push_back(*took);
  }
  std::sort(loaded.begin(), loaded.end());
  std::printf("idle max %s; beside %d stalled heads: p50 %s max %s (bound %s)\n",
              absl::FormatDuration(idle_max).c_str(), kAddresses * kPerAddress,
              absl::FormatDuration(loaded[kReviews / 2]).c_str(),
              absl::FormatDuration(loaded.back()).c_str(), absl::FormatDuration(bound).c_str());
  // The stalled requests are still being read: none reached a worker, none was cut.
  const ConnectionStats stats = server->connection_stats();
  EXPECT_EQ(stats.requests, 2u * kReviews);
  EXPECT_EQ(stats.request_timeouts, 0u);
  EXPECT_GE(stats.buffered_bytes, static_cast<uint64_t>(kAddresses * kPerAddress) * head.size());
}

}  // namespace
}  // namespace weightcache::webhook
