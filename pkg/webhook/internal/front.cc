#include "pkg/webhook/internal/front.h"

#include <arpa/inet.h>
#include <openssl/err.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "pkg/webhook/internal/front_impl.h"

namespace weightcache::webhook::internal {
namespace {

// Who a connection is: its source address, the key of its caps and of its queue.
absl::StatusOr<net::Identity> SourceOf(int fd) {
  sockaddr_in a{};
  socklen_t len = sizeof(a);
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    return ErrnoStatus(errno, "getpeername");
  }
  char text[INET_ADDRSTRLEN] = "";
  inet_ntop(AF_INET, &a.sin_addr, text, sizeof(text));
  return net::Identity{text, text, {}};
}

}  // namespace

// Listens through the acceptor (pkg/net/acceptor.h), which this loop runs: caps per source
// address and in all, the handshake's first byte within its timeout, EMFILE back-off.
absl::Status Front::Impl::Listen(const std::string& host, int port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, host.c_str(), &a.sin_addr);
  ScopedFd listening(::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  const int one = 1;
  if (!listening ||
      ::setsockopt(listening.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0 ||
      ::bind(listening.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      ::listen(listening.get(), o_.listen_backlog) != 0) {
    return absl::UnavailableError(
        absl::StrCat("webhook: cannot listen on ", host, ":", port, ": ", std::strerror(errno)));
  }
  socklen_t len = sizeof(a);
  ::getsockname(listening.get(), reinterpret_cast<sockaddr*>(&a), &len);
  port_ = ntohs(a.sin_port);
  epoll_fd_ = ::epoll_create1(EPOLL_CLOEXEC);
  wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (epoll_fd_ < 0 || wake_fd_ < 0) {
    return absl::InternalError(absl::StrCat("webhook: epoll/eventfd: ", std::strerror(errno)));
  }
  net::ListenerOptions door;
  door.name = "webhook";
  door.limits = {.total = static_cast<uint64_t>(o_.max_connections),
                 .per_key = static_cast<uint64_t>(o_.max_connections_per_source),
                 .over_cap = 0,
                 .own_caps = {}};
  door.first_byte = std::chrono::milliseconds(o_.handshake_timeout_ms);
  door.idle = std::chrono::milliseconds(o_.idle_timeout_ms);
  door.own_thread = false;  // run by this loop: serve and make_room touch its connections
  door.identify = [](int fd, const std::string&) { return SourceOf(fd); };
  door.serve = [this](net::Accepted c) {
    Open(std::move(c));
    return true;
  };
  door.make_room = [this] { return CloseOldestHandshake(); };
  door.on_refused = [this](const std::string& reason) { Refused(reason); };
  auto acceptor = net::Acceptor::Start(std::move(door));
  if (!acceptor.ok()) return acceptor.status();
  acceptor_ = *std::move(acceptor);
  if (absl::Status s = acceptor_->Listen(std::move(listening), ""); !s.ok()) return s;
  epoll_event ev{};
  ev.events = EPOLLIN;
  for (int fd : {acceptor_->fd(), wake_fd_}) {
    ev.data.fd = fd;
    ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev);
  }
  return absl::OkStatus();
}

// The workers finish the requests they hold while the loop still runs, so that their answers
// are sent; then the loop ends and every connection is closed.
Front::Impl::~Impl() {
  closing_ = true;
  {
    std::lock_guard<std::mutex> lock(mu_);
    workers_stop_ = true;
  }
  ready_cv_.notify_all();
  for (std::thread& t : workers_) t.join();
  stop_ = true;
  if (loop_.joinable()) {
    Wake();
    loop_.join();
  }
  if (acceptor_ != nullptr) acceptor_->Stop();
  conns_.clear();
  waiting_.clear();
  returned_.clear();
  for (int fd : {epoll_fd_, wake_fd_}) {
    if (fd >= 0) ::close(fd);
  }
}

void Front::Impl::Wake() {
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(wake_fd_, &one, sizeof(one));
}

ConnectionStats Front::Impl::stats() const {
  ConnectionStats s;
  s.accepted = accepted_.load();
  s.handshake_timeouts = handshake_timeouts_.load();
  s.handshake_failures = handshake_failures_.load();
  s.request_timeouts = request_timeouts_.load();
  s.source_refusals = source_refusals_.load();
  s.total_refusals = total_refusals_.load();
  s.descriptor_backoffs = descriptor_backoffs_.load();
  s.idle_closes = idle_closes_.load();
  s.requests = requests_.load();
  s.refused_heads = refused_heads_.load();
  s.queue_refusals = queue_refusals_.load();
  s.queue_timeouts = queue_timeouts_.load();
  s.buffer_cuts = buffer_cuts_.load();
  s.answer_timeouts = answer_timeouts_.load();
  s.waiting = waiting_now_.load();
  s.buffered_bytes = buffered_now_.load();
  return s;
}

void Front::Impl::Count(std::atomic<uint64_t>& counter, const std::string& what) {
  const uint64_t n = ++counter;
  if (n == 1 || n % 100 == 0) {  // a flood of slow clients is logged, not echoed
    WC_LOG_WARN("webhook: %s (%d so far)", what, n);
  }
}

void Front::Impl::Run() {
  std::vector<epoll_event> events(256);
  while (!stop_) {
    int timeout = timers_.empty() ? -1 : MsUntil(timers_.begin()->first);
    const int door = acceptor_->TimeoutMs();
    if (door >= 0 && (timeout < 0 || door < timeout)) timeout = door;
    const int n = ::epoll_wait(epoll_fd_, events.data(), static_cast<int>(events.size()), timeout);
    for (int i = 0; i < n; ++i) {
      const int fd = events[i].data.fd;
      if (fd == acceptor_->fd()) {
        continue;  // run below, on every pass
      } else if (fd == wake_fd_) {
        uint64_t drained = 0;
        [[maybe_unused]] ssize_t r = ::read(wake_fd_, &drained, sizeof(drained));
        TakeBack();
      } else if (auto it = conns_.find(fd); it != conns_.end()) {
        Progress(it->second.get());
      }
    }
    Expire();
    if (!stop_) acceptor_->Run();
  }
  TakeBack();  // the workers' last answers, sent if the sockets take them at once
}

// The door's refusals, in ConnectionStats (the acceptor logs them).
void Front::Impl::Refused(const std::string& reason) {
  if (reason == "per_key") {
    ++source_refusals_;
  } else if (reason == "total") {
    ++total_refusals_;
  } else if (reason == "first_byte") {
    ++handshake_timeouts_;
  } else if (reason == "descriptors") {
    ++descriptor_backoffs_;
  } else if (reason == "idle") {
    ++idle_closes_;
  } else {
    ++handshake_failures_;  // "identity": gone before it was asked who it is
  }
}

// At the cap in all: the connection longest in its handshake (none has a request yet) goes
// for the newcomer; false when every one is past its handshake.
bool Front::Impl::CloseOldestHandshake() {
  Conn* oldest = nullptr;
  for (const auto& [fd, c] : conns_) {
    if (c->phase == Phase::kHandshake && (oldest == nullptr || c->deadline < oldest->deadline)) {
      oldest = c.get();
    }
  }
  if (oldest == nullptr) return false;
  Close(oldest);
  return true;
}

// Starts the TLS session of a connection the door admitted; its handshake must be done within
// the timeout of its accept.
void Front::Impl::Open(net::Accepted a) {
  ++accepted_;
  auto c = std::make_unique<Conn>();
  c->fd = a.fd.release();
  c->source = a.who.key;
  c->slot = std::move(a.slot);
  c->activity = std::move(a.activity);
  c->activity.SetBusy(true);  // until it waits for a request, kept alive
  const int one = 1;
  ::setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  c->ssl = SSL_new(ctx_);
  if (c->ssl == nullptr || SSL_set_fd(c->ssl, c->fd) != 1) {
    WC_LOG_ERROR("webhook: SSL_new failed: out of memory?");
    Close(c.release());
    return;
  }
  // The loop sends answers as the socket takes them, from a buffer that moves.
  SSL_set_mode(c->ssl, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  SSL_set_accept_state(c->ssl);
  Conn* raw = c.get();
  conns_[raw->fd] = std::move(c);
  Interest(raw, EPOLLIN);
  SetDeadline(raw, a.accepted + std::chrono::milliseconds(o_.handshake_timeout_ms));
  Progress(raw);  // the ClientHello is there already
}

void Front::Impl::Interest(Conn* c, uint32_t events) {
  if (c->events == events) return;
  epoll_event ev{};
  ev.events = events;
  ev.data.fd = c->fd;
  ::epoll_ctl(epoll_fd_, c->events == 0 ? EPOLL_CTL_ADD : EPOLL_CTL_MOD, c->fd, &ev);
  c->events = events;
}

void Front::Impl::Unwatch(Conn* c) {
  if (c->events != 0) ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, c->fd, nullptr);
  c->events = 0;
}

void Front::Impl::SetDeadline(Conn* c, Clock::time_point at) {
  timers_.erase({c->deadline, c->fd});
  c->deadline = at;
  timers_.insert({at, c->fd});
}

void Front::Impl::AwaitRequest(Conn* c) {
  timers_.erase({c->deadline, c->fd});
  c->deadline = Clock::time_point::max();
  c->activity.SetBusy(false);
}

void Front::Impl::Account(Conn* c) {
  const size_t now = c->in.size() + c->out.size();
  buffered_ = buffered_ + now - c->counted;
  c->counted = now;
  buffered_now_.store(buffered_, std::memory_order_relaxed);
}

// Moves a connection on by what its socket allows: the handshake, the request, the answer or
// the bytes dropped before closing; any step that would block waits for epoll.
void Front::Impl::Progress(Conn* c) {
  switch (c->phase) {
    case Phase::kHandshake: {
      ERR_clear_error();  // SSL_get_error reads the thread's queue: only this call's errors
      const int ret = SSL_do_handshake(c->ssl);
      if (ret != 1) {
        const int err = SSL_get_error(c->ssl, ret);
        if (err == SSL_ERROR_WANT_READ || err == SSL_ERROR_WANT_WRITE) {
          Interest(c, err == SSL_ERROR_WANT_READ ? EPOLLIN : EPOLLOUT);
        } else {
          ++handshake_failures_;
          Close(c);
        }
        return;
      }
      c->phase = Phase::kRequest;
      AwaitRequest(c);
      return ReadRequest(c);
    }
    case Phase::kRequest:
      return ReadRequest(c);
    case Phase::kWriting:
      return Flush(c);
    case Phase::kClosing:
      return Drain(c);
    case Phase::kQueued:
    case Phase::kWorker:
      return;  // not in epoll
  }
}

// Reads until the buffer holds a whole request (its head, then its body by Content-Length),
// which goes to the queue; a head the webhook does not take is answered and closed here.
void Front::Impl::ReadRequest(Conn* c) {
  char buf[kReadBytes];
  for (;;) {
    if (c->need == 0) {
      const size_t from = c->head_scan >= 3 ? c->head_scan - 3 : 0;
      const size_t end = c->in.find("\r\n\r\n", from);
      if (end == std::string::npos) {
        c->head_scan = c->in.size();
        if (c->in.size() >= kMaxHeadBytes) {
          return Refuse(c, 431, absl::StrCat("request head larger than ", kMaxHeadBytes, " bytes"),
                        refused_heads_);
        }
      } else {
        HeadVerdict head = ReadHead(absl::string_view(c->in).substr(0, end), o_.max_body_bytes);
        if (head.status != 0) return Refuse(c, head.status, head.why, refused_heads_);
        c->need = end + 4 + head.body;
      }
    }
    if (c->need != 0 && c->in.size() >= c->need) return Enqueue(c);
    ERR_clear_error();
    const int n = SSL_read(c->ssl, buf, sizeof(buf));
    if (n <= 0) {
      const int err = SSL_get_error(c->ssl, n);
      if (err == SSL_ERROR_WANT_READ || err == SSL_ERROR_WANT_WRITE) {
        return Interest(c, err == SSL_ERROR_WANT_READ ? EPOLLIN : EPOLLOUT);
      }
      return Close(c);  // closed by the peer, or a TLS error
    }
    if (c->in.empty()) {
      c->activity.SetBusy(true);
      SetDeadline(c, Clock::now() + std::chrono::milliseconds(o_.request_deadline_ms));
    }
    c->in.append(buf, static_cast<size_t>(n));
    Account(c);
    if (buffered_ > o_.buffer_budget_bytes && !MakeRoom(c)) return;
  }
}

// Past the buffer budget, cuts the connections with the largest requests still being read
// until the total fits; false when that cut `c` itself.
bool Front::Impl::MakeRoom(Conn* c) {
  while (buffered_ > o_.buffer_budget_bytes) {
    Conn* largest = c;
    for (const auto& [fd, other] : conns_) {
      if (other->phase == Phase::kRequest && other->in.size() > largest->in.size()) {
        largest = other.get();
      }
    }
    const bool self = largest == c;
    Refuse(largest, 503,
           absl::StrCat("the webhook holds ", buffered_,
                        " bytes of requests and answers, its budget is ", o_.buffer_budget_bytes,
                        "; this request, ", largest->in.size(),
                        " bytes so far, was the largest being read"),
           buffer_cuts_);
    if (self) return false;
  }
  return true;
}

void Front::Impl::Close(Conn* c) {
  std::unique_ptr<Conn> owned;
  if (auto it = conns_.find(c->fd); it != conns_.end()) {
    owned = std::move(it->second);
    conns_.erase(it);
  } else {
    owned.reset(c);  // never registered
  }
  Unwatch(c);
  timers_.erase({c->deadline, c->fd});
  buffered_ -= c->counted;
  buffered_now_.store(buffered_, std::memory_order_relaxed);
}  // `owned` goes: its descriptor, TLS session and place in the caps

Front::Front(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Front::~Front() = default;
int Front::port() const { return impl_->port_; }
ConnectionStats Front::stats() const { return impl_->stats(); }

absl::StatusOr<std::unique_ptr<Front>> Front::Start(const std::string& host, int port,
                                                    ssl_ctx_st* ctx, FrontOptions options,
                                                    ServeFn serve) {
  if (options.listen_backlog < 1 || options.handshake_timeout_ms < 1 ||
      options.request_deadline_ms < 1 || options.io_timeout_ms < 1 || options.idle_timeout_ms < 1 ||
      options.max_connections < 1 || options.max_connections_per_source < 1 ||
      options.num_threads < 1 || options.max_queued_per_source < 1 ||
      options.queue_deadline_ms < 1) {
    return absl::InvalidArgumentError(
        "webhook: the listen backlog, timeouts, connection and queue limits and threads must be "
        ">= 1");
  }
  if (options.buffer_budget_bytes < options.max_body_bytes + kMaxHeadBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "webhook: the buffer budget (--buffer_budget_bytes, ", options.buffer_budget_bytes,
        " bytes) must hold one request of the largest body (", options.max_body_bytes,
        " bytes) and its head (", kMaxHeadBytes, " bytes)"));
  }
  // The loop writes answers and close_notify to clients that may be gone: EPIPE, not a signal.
  struct sigaction pipe {};
  if (::sigaction(SIGPIPE, nullptr, &pipe) == 0 && pipe.sa_handler == SIG_DFL) {
    ::signal(SIGPIPE, SIG_IGN);
  }
  auto impl = std::make_unique<Impl>(ctx, options, std::move(serve));
  if (absl::Status s = impl->Listen(host, port); !s.ok()) return s;
  Impl* raw = impl.get();
  for (int i = 0; i < options.num_threads; ++i) raw->workers_.emplace_back([raw] { raw->Work(); });
  raw->loop_ = std::thread([raw] { raw->Run(); });
  return std::unique_ptr<Front>(new Front(std::move(impl)));
}

}  // namespace weightcache::webhook::internal
