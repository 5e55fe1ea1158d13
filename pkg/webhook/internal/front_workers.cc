// The webhook front's queues and workers (front_impl.h): complete requests wait in one queue per
// source address, served in turn; workers answer into a buffer the loop sends; a request
// waiting past its deadline is answered 503.
#include <openssl/err.h>

#include "pkg/webhook/internal/front_impl.h"

namespace weightcache::webhook::internal {

// Hands a whole request to the queue of its source address; one past that queue's bound is
// answered 503 here.
void Front::Impl::Enqueue(Conn* c) {
  Unwatch(c);
  c->phase = Phase::kQueued;
  SetDeadline(c, Clock::now() + std::chrono::milliseconds(o_.queue_deadline_ms));
  auto it = conns_.find(c->fd);
  std::unique_ptr<Conn> owned = std::move(it->second);
  conns_.erase(it);
  size_t waiting = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    std::deque<std::unique_ptr<Conn>>& queue = waiting_[c->source];
    waiting = queue.size();
    if (waiting < static_cast<size_t>(o_.max_queued_per_source)) {
      if (queue.empty()) turns_.push_back(c->source);
      queue.push_back(std::move(owned));
      ++waiting_now_;
    }
  }
  if (owned == nullptr) {
    ready_cv_.notify_one();
    return;
  }
  conns_[c->fd] = std::move(owned);
  Refuse(c, 503,
         absl::StrCat(c->source, " has ", waiting,
                      " requests waiting for the webhook's workers, its limit "
                      "(--max_queued_per_source)"),
         queue_refusals_);
}

void Front::Impl::Work() {
  for (;;) {
    std::unique_ptr<Conn> c;
    {
      std::unique_lock<std::mutex> lock(mu_);
      ready_cv_.wait(lock, [&] { return workers_stop_ || !turns_.empty(); });
      if (workers_stop_) return;
      std::string source = std::move(turns_.front());
      turns_.pop_front();
      auto it = waiting_.find(source);
      c = std::move(it->second.front());
      it->second.pop_front();
      if (it->second.empty()) {
        waiting_.erase(it);
      } else {
        turns_.push_back(std::move(source));  // the address's next request waits its turn
      }
      c->phase = Phase::kWorker;
      --waiting_now_;
    }
    ++requests_;
    ConnStream stream(*c);
    bool closed = false;
    // A request that httplib did not read to the end the loop framed is its last: the two
    // parsers must agree on where the next one starts.
    c->keep = serve_(stream, /*close=*/closing_.load(), closed) && !closed && !closing_ &&
              stream.consumed() == c->need;
    c->in.erase(0, stream.consumed());
    c->need = 0;
    c->head_scan = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      returned_.push_back(std::move(c));
    }
    Wake();
  }
}

// Takes the workers' connections back and sends their answers.
void Front::Impl::TakeBack() {
  std::vector<std::unique_ptr<Conn>> back;
  {
    std::lock_guard<std::mutex> lock(mu_);
    back.swap(returned_);
  }
  for (std::unique_ptr<Conn>& owned : back) {
    Conn* c = owned.get();
    conns_[c->fd] = std::move(owned);
    Account(c);
    c->phase = Phase::kWriting;
    SetDeadline(c, Clock::now() + std::chrono::milliseconds(o_.io_timeout_ms));
    Flush(c);
  }
}

// Sends the answer as the socket takes it; then reads the connection's next request, or
// closes it.
void Front::Impl::Flush(Conn* c) {
  while (!c->out.empty()) {
    ERR_clear_error();
    const int n = SSL_write(c->ssl, c->out.data(),
                            static_cast<int>(std::min<size_t>(c->out.size(), INT_MAX)));
    if (n <= 0) {
      const int err = SSL_get_error(c->ssl, n);
      if (err == SSL_ERROR_WANT_READ || err == SSL_ERROR_WANT_WRITE) {
        Account(c);
        return Interest(c, err == SSL_ERROR_WANT_READ ? EPOLLIN : EPOLLOUT);
      }
      return Close(c);
    }
    c->out.erase(0, static_cast<size_t>(n));
  }
  Account(c);
  if (!c->keep) {
    // close_notify, then what the client still sends is dropped until it closes: a reset
    // would make its kernel drop the answer unread.
    SSL_shutdown(c->ssl);
    ::shutdown(c->fd, SHUT_WR);
    c->in.clear();
    Account(c);
    c->phase = Phase::kClosing;
    Interest(c, EPOLLIN);
    SetDeadline(c, Clock::now() + kLinger);
    return Drain(c);
  }
  c->phase = Phase::kRequest;
  Interest(c, EPOLLIN);
  if (c->in.empty()) {
    AwaitRequest(c);
  } else {
    SetDeadline(c, Clock::now() + std::chrono::milliseconds(o_.request_deadline_ms));
  }
  ReadRequest(c);  // a pipelined request may be whole already, or inside the TLS session
}

void Front::Impl::Drain(Conn* c) {
  char buf[kReadBytes];
  for (;;) {
    const ssize_t n = ::recv(c->fd, buf, sizeof(buf), MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    if (n < 0 && errno == EINTR) continue;
    c->dropped += n > 0 ? static_cast<size_t>(n) : 0;
    if (n <= 0 || c->dropped > kLingerBytes) return Close(c);
  }
}

// Answers `status` with `why` as its body, and closes the connection after it.
void Front::Impl::Refuse(Conn* c, int status, const std::string& why,
                         std::atomic<uint64_t>& counter) {
  Count(counter,
        absl::StrCat("a request from ", c->source, " answered ", status, " and closed: ", why));
  c->in.clear();
  c->need = 0;
  c->out = RefusalAnswer(status, why);
  c->keep = false;
  c->phase = Phase::kWriting;
  SetDeadline(c, Clock::now() + std::chrono::milliseconds(o_.io_timeout_ms));
  Flush(c);
}

void Front::Impl::Expire() {
  const Clock::time_point now = Clock::now();
  while (!timers_.empty() && timers_.begin()->first <= now) {
    const int fd = timers_.begin()->second;
    auto it = conns_.find(fd);
    if (it == conns_.end()) {  // queued, or a worker's (then its timer is stale)
      timers_.erase(timers_.begin());
      ExpireQueued(now);
      continue;
    }
    Conn* c = it->second.get();
    if (c->phase == Phase::kHandshake) {
      Count(handshake_timeouts_,
            "a TLS handshake was not done in time: closed (--handshake_timeout_ms)");
    } else if (c->phase == Phase::kRequest && !c->in.empty()) {
      Count(request_timeouts_,
            "a request did not arrive whole in time: closed (--connection_deadline_ms)");
    } else if (c->phase == Phase::kWriting) {
      Count(answer_timeouts_, "an answer was not taken in time: closed (--request_timeout_ms)");
    }
    Close(c);
  }
}

// Answers 503 to the requests that waited for a worker past the queue deadline. Each address's
// queue is in arrival order, so the expired ones are at their fronts.
void Front::Impl::ExpireQueued(Clock::time_point now) {
  std::vector<std::unique_ptr<Conn>> late;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = waiting_.begin(); it != waiting_.end();) {
      std::deque<std::unique_ptr<Conn>>& queue = it->second;
      while (!queue.empty() && queue.front()->deadline <= now) {
        late.push_back(std::move(queue.front()));
        queue.pop_front();
        --waiting_now_;
      }
      if (queue.empty()) {
        turns_.erase(std::find(turns_.begin(), turns_.end(), it->first));
        it = waiting_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (std::unique_ptr<Conn>& owned : late) {
    Conn* c = owned.get();
    conns_[c->fd] = std::move(owned);
    Refuse(c, 503,
           absl::StrCat("the request waited ", o_.queue_deadline_ms,
                        " ms for a worker (--queue_deadline_ms)"),
           queue_timeouts_);
  }
}

}  // namespace weightcache::webhook::internal
