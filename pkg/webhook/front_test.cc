// The webhook front's queue of whole requests and its buffer budget (issue 56), over real TLS on
// 127.0.0.1, with a serve function the test holds: a request reaches it only whole, and the test
// decides when each one is answered.
#include "pkg/webhook/internal/front.h"

#include <gtest/gtest.h>
#include <httplib.h>
#include <openssl/ssl.h>

#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "pkg/webhook/testing/load.h"
#include "tests/testutil/temp_dir.h"

namespace weightcache::webhook::internal {
namespace {

using testing::TlsClient;

// The serve function's gate: each request waits for a permit; the request targets seen, in the
// order the worker took them.
class Gate {
 public:
  void Enter(const std::string& target) {
    std::unique_lock<std::mutex> lock(mu_);
    seen_.push_back(target);
    cv_.notify_all();
    cv_.wait(lock, [&] { return permits_ > 0; });
    --permits_;
  }
  void Allow(int n) {
    std::lock_guard<std::mutex> lock(mu_);
    permits_ += n;
    cv_.notify_all();
  }
  // Waits until `n` requests entered; false after 30 s.
  bool WaitEntered(size_t n) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(30), [&] { return seen_.size() >= n; });
  }
  std::vector<std::string> seen() {
    std::lock_guard<std::mutex> lock(mu_);
    return seen_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int permits_ = 0;
  std::vector<std::string> seen_;
};

class FrontTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(testing::WriteSelfSignedPair(dir_.path()).ok());
    ctx_.reset(SSL_CTX_new(TLS_server_method()));
    ASSERT_EQ(
        SSL_CTX_use_certificate_file(ctx_.get(), (dir_ / "tls.crt").c_str(), SSL_FILETYPE_PEM), 1);
    ASSERT_EQ(SSL_CTX_use_PrivateKey_file(ctx_.get(), (dir_ / "tls.key").c_str(), SSL_FILETYPE_PEM),
              1);
  }

  // A test that failed half-way leaves no worker waiting at the gate.
  void TearDown() override {
    gate_.Allow(1 << 20);
    front_.reset();
  }

  // One worker, unless the options say otherwise; each request is answered 200 with its target
  // once the gate lets it, and its connection closed.
  void Start(FrontOptions o) {
    absl::StatusOr<std::unique_ptr<Front>> front =
        Front::Start("127.0.0.1", 0, ctx_.get(), o, [this](httplib::Stream& s, bool, bool& closed) {
          std::string request;
          char buf[4096];
          for (ssize_t n; (n = s.read(buf, sizeof(buf))) > 0;) {
            request.append(buf, static_cast<size_t>(n));
          }
          const std::string target = request.substr(5, request.find(' ', 5) - 5);  // "POST /x "
          gate_.Enter(target);
          const std::string answer = absl::StrCat(
              "HTTP/1.1 200 OK\r\nContent-Length: ", target.size(), "\r\n\r\n", target);
          s.write(answer.data(), answer.size());
          if (keep_alive_) return true;
          closed = true;
          return false;
        });
    ASSERT_TRUE(front.ok()) << front.status();
    front_ = *std::move(front);
  }

  // Starts one worker and holds it with a request from 127.0.0.2 to /held.
  void StartOneBusyWorker(FrontOptions o) {
    o.num_threads = 1;
    ASSERT_NO_FATAL_FAILURE(Start(o));
    held_ = Send("127.0.0.2", "/held");
    ASSERT_TRUE(gate_.WaitEntered(1));
  }

  // A connection from `source` that sent a whole POST to `target` with `body_bytes` of body.
  std::unique_ptr<TlsClient> Send(const std::string& source, const std::string& target,
                                  size_t body_bytes = 2) {
    std::unique_ptr<TlsClient> c = TlsClient::Connect(source, front_->port(), absl::Seconds(30));
    EXPECT_NE(c, nullptr);
    if (c == nullptr) return c;
    EXPECT_TRUE(c->Send(absl::StrCat("POST ", target, " HTTP/1.1\r\nHost: x\r\nContent-Length: ",
                                     body_bytes, "\r\n\r\n", std::string(body_bytes, 'x'))));
    return c;
  }

  // Waits until the front's stats satisfy `ok` (a poll of counters); false after 30 s.
  template <typename Pred>
  bool WaitStats(Pred ok) {
    const absl::Time until = absl::Now() + absl::Seconds(30);
    while (!ok(front_->stats())) {
      if (absl::Now() > until) return false;
      absl::SleepFor(absl::Milliseconds(5));
    }
    return true;
  }

  static std::string Answer(TlsClient& c, absl::Duration within = absl::Seconds(30)) {
    bool closed = false;
    std::string got = c.Receive(within, closed);
    return closed ? got : absl::StrCat("(still open) ", got);
  }

  weightcache::testing::TempDir dir_;
  std::unique_ptr<SSL_CTX, decltype(&SSL_CTX_free)> ctx_{nullptr, &SSL_CTX_free};
  Gate gate_;
  bool keep_alive_ = false;  // answers keep the connection for another request
  std::unique_ptr<TlsClient> held_;
  std::unique_ptr<Front> front_;
};

// Finding (issue 56): the queue of whole requests had no bound. One address may have
// max_queued_per_source waiting; one more is answered 503 by the loop at once, and another
// address still queues.
TEST_F(FrontTest, AnAddressPastItsQueueBoundIsAnswered503AndOthersStillQueue) {
  FrontOptions o;
  o.max_queued_per_source = 2;
  StartOneBusyWorker(o);
  auto first = Send("127.0.0.2", "/a1");
  auto second = Send("127.0.0.2", "/a2");
  ASSERT_TRUE(WaitStats([](const ConnectionStats& s) { return s.waiting == 2; }));
  auto third = Send("127.0.0.2", "/a3");
  const std::string refused = Answer(*third);
  EXPECT_TRUE(absl::StartsWith(refused, "HTTP/1.1 503 Service Unavailable\r\n")) << refused;
  EXPECT_TRUE(absl::StrContains(
      refused, "127.0.0.2 has 2 requests waiting for the webhook's workers, its limit"))
      << refused;
  auto other = Send("127.0.0.3", "/b1");
  ASSERT_TRUE(WaitStats([](const ConnectionStats& s) { return s.waiting == 3; }));
  gate_.Allow(4);
  for (auto* c : {held_.get(), first.get(), second.get(), other.get()}) {
    EXPECT_TRUE(absl::StartsWith(Answer(*c), "HTTP/1.1 200 OK\r\n"));
  }
  EXPECT_EQ(front_->stats().queue_refusals, 1u);
  EXPECT_EQ(front_->stats().requests, 4u);
}

// Finding (issue 56): the queue had no deadline. A request that waited queue_deadline_ms for a
// worker is answered 503 by the loop, not before its deadline, and never reaches a worker.
TEST_F(FrontTest, ARequestWaitingPastTheQueueDeadlineIsAnswered503) {
  FrontOptions o;
  o.queue_deadline_ms = 300;
  StartOneBusyWorker(o);
  const absl::Time sent = absl::Now();
  auto late = Send("127.0.0.3", "/late");
  const std::string answer = Answer(*late);
  EXPECT_GE(absl::Now() - sent, absl::Milliseconds(300));
  EXPECT_TRUE(absl::StartsWith(answer, "HTTP/1.1 503 Service Unavailable\r\n")) << answer;
  EXPECT_TRUE(absl::StrContains(answer, "the request waited 300 ms for a worker")) << answer;
  EXPECT_EQ(front_->stats().queue_timeouts, 1u);
  gate_.Allow(1);
  EXPECT_TRUE(absl::StartsWith(Answer(*held_), "HTTP/1.1 200 OK\r\n"));
  EXPECT_EQ(gate_.seen(), std::vector<std::string>{"/held"});
}

// The workers take the addresses with requests waiting in turn: a review from a second address
// waits behind one request of a flooding address, not behind all of them.
TEST_F(FrontTest, AddressesAreServedInTurnNotInArrivalOrder) {
  FrontOptions o;
  StartOneBusyWorker(o);
  std::vector<std::unique_ptr<TlsClient>> flood;
  for (int i = 0; i < 3; ++i) {
    flood.push_back(Send("127.0.0.2", absl::StrCat("/a", i)));
    ASSERT_TRUE(WaitStats([&](const ConnectionStats& s) { return s.waiting == i + 1u; }));
  }
  auto review = Send("127.0.0.3", "/review");
  ASSERT_TRUE(WaitStats([](const ConnectionStats& s) { return s.waiting == 4; }));
  gate_.Allow(5);
  EXPECT_TRUE(absl::StartsWith(Answer(*review), "HTTP/1.1 200 OK\r\n"));
  for (auto& c : flood) EXPECT_TRUE(absl::StartsWith(Answer(*c), "HTTP/1.1 200 OK\r\n"));
  EXPECT_EQ(gate_.seen(), (std::vector<std::string>{"/held", "/a0", "/review", "/a1", "/a2"}));
}

// Bodies are read in the loop, so their bytes are bounded in total: past buffer_budget_bytes
// the connection with the largest request still being read is answered 503 and closed, and the
// request that brought the total over the budget is served.
TEST_F(FrontTest, TheLargestRequestBeingReadIsCutWhenTheBufferBudgetIsFull) {
  FrontOptions o;
  o.max_body_bytes = 256 << 10;
  o.buffer_budget_bytes = (256 << 10) + (64 << 10);
  Start(o);
  gate_.Allow(1);
  std::unique_ptr<TlsClient> big =
      TlsClient::Connect("127.0.0.2", front_->port(), absl::Seconds(30));
  ASSERT_NE(big, nullptr);
  ASSERT_TRUE(big->Send(absl::StrCat("POST /big HTTP/1.1\r\nHost: x\r\nContent-Length: ", 256 << 10,
                                     "\r\n\r\n", std::string(240 << 10, 'x'))));
  ASSERT_TRUE(WaitStats([](const ConnectionStats& s) { return s.buffered_bytes >= 240 << 10; }));
  auto small = Send("127.0.0.3", "/small", 100 << 10);
  EXPECT_TRUE(absl::StartsWith(Answer(*small), "HTTP/1.1 200 OK\r\n"));
  const std::string cut = Answer(*big);
  EXPECT_TRUE(absl::StartsWith(cut, "HTTP/1.1 503 Service Unavailable\r\n")) << cut;
  EXPECT_TRUE(absl::StrContains(cut, "was the largest being read")) << cut;
  EXPECT_EQ(front_->stats().buffer_cuts, 1u);
  EXPECT_EQ(gate_.seen(), std::vector<std::string>{"/small"});
  EXPECT_TRUE(WaitStats([](const ConnectionStats& s) { return s.buffered_bytes == 0; }));
}

// A client that leaves while its request waits costs the loop a failed write (EPIPE, not a
// signal that ends the process), and the next client is served.
TEST_F(FrontTest, AClientGoneBeforeItsAnswerIsDroppedAndTheNextServed) {
  StartOneBusyWorker(FrontOptions{});
  for (int i = 0; i < 8; ++i) Send("127.0.0.3", absl::StrCat("/gone", i)).reset();  // closed
  ASSERT_TRUE(WaitStats([](const ConnectionStats& s) { return s.waiting == 8; }));
  gate_.Allow(1 << 20);
  EXPECT_TRUE(absl::StartsWith(Answer(*held_), "HTTP/1.1 200 OK\r\n"));
  ASSERT_TRUE(gate_.WaitEntered(9));
  auto next = Send("127.0.0.4", "/next");
  EXPECT_TRUE(absl::StartsWith(Answer(*next), "HTTP/1.1 200 OK\r\n"));
}

// A kept-alive connection waiting for its next request is ended by the door (the acceptor's
// idle timeout) after idle_timeout_ms; one that keeps sending requests is kept, however long.
TEST_F(FrontTest, AKeptAliveConnectionIsEndedByTheDoorAfterIdleAndABusyOneKept) {
  FrontOptions o;
  o.idle_timeout_ms = 300;
  keep_alive_ = true;
  Start(o);
  gate_.Allow(1 << 20);
  auto quiet = Send("127.0.0.2", "/quiet");
  EXPECT_EQ(Answer(*quiet, absl::Milliseconds(200)),
            "(still open) HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\n/quiet");
  auto busy = Send("127.0.0.3", "/busy0");
  for (int i = 1; i <= 8; ++i) {
    const std::string got = Answer(*busy, absl::Milliseconds(150));
    EXPECT_TRUE(absl::StartsWith(got, "(still open) HTTP/1.1 200 OK")) << got;
    ASSERT_TRUE(busy->Send(
        absl::StrCat("POST /busy", i, " HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nxx")));
  }
  EXPECT_EQ(Answer(*quiet), "") << "ended with nothing more";
  EXPECT_TRUE(
      absl::StrContains(Answer(*busy, absl::Milliseconds(100)), "(still open) HTTP/1.1 200"));
  EXPECT_TRUE(WaitStats([](const ConnectionStats& s) { return s.idle_closes == 1; }));
  EXPECT_EQ(Answer(*busy), "") << "idle once its requests stopped";
  EXPECT_TRUE(WaitStats([](const ConnectionStats& s) { return s.idle_closes == 2; }));
}

// Finding: a client that drops its TLS session without close_notify leaves an error in the
// loop thread's OpenSSL queue; SSL_get_error then reported the next connection's "want read"
// as a failure and closed it (its handshake, or its read of a kept-alive request). Each
// call now starts from an empty queue.
TEST_F(FrontTest, AClientThatDropsItsTlsSessionLeavesTheNextConnectionServed) {
  keep_alive_ = true;
  Start(FrontOptions{});
  gate_.Allow(1 << 20);
  auto kept = Send("127.0.0.2", "/kept");
  EXPECT_TRUE(
      absl::StartsWith(Answer(*kept, absl::Milliseconds(200)), "(still open) HTTP/1.1 200"));
  for (int i = 0; i < 3; ++i) {
    auto dropped = TlsClient::Connect("127.0.0.3", front_->port(), absl::Seconds(30));
    ASSERT_NE(dropped, nullptr) << "connection " << i;
    dropped.reset();  // closes its socket: no close_notify
    absl::SleepFor(absl::Milliseconds(50));
    ASSERT_TRUE(kept->Send("POST /again HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nxx"));
    EXPECT_TRUE(
        absl::StartsWith(Answer(*kept, absl::Milliseconds(300)), "(still open) HTTP/1.1 200"))
        << "after dropped connection " << i;
  }
  EXPECT_EQ(front_->stats().handshake_failures, 0u);
}

// A buffer budget that cannot hold one request of the largest body is refused at start.
TEST(FrontOptionsTest, ABudgetSmallerThanOneRequestIsRefused) {
  FrontOptions o;
  o.max_body_bytes = 4 << 20;
  o.buffer_budget_bytes = 4 << 20;
  absl::StatusOr<std::unique_ptr<Front>> front =
      Front::Start("127.0.0.1", 0, nullptr, o, [](httplib::Stream&, bool, bool&) { return false; });
  ASSERT_FALSE(front.ok());
  EXPECT_TRUE(absl::StrContains(front.status().message(), "--buffer_budget_bytes, 4194304 bytes"))
      << front.status();
}

}  // namespace
}  // namespace weightcache::webhook::internal
