#include "pkg/webhook/internal/front.h"

#include <arpa/inet.h>
#include <httplib.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "pkg/util/log.h"

namespace weightcache::webhook::internal {
namespace {

using Clock = std::chrono::steady_clock;
constexpr size_t kMaxHeadBytes = 64 << 10;  // past it httplib answers (its lines are <= 8 KiB)
constexpr int kAcceptsPerWakeup = 64;       // then the loop serves the connections it has

enum class Phase { kHandshake, kRequest, kWorker };

// One connection: its socket and TLS session, and the bytes read but not yet served. Owned by
// the loop, or by one worker while it serves a request.
struct Conn {
  int fd = -1;
  SSL* ssl = nullptr;
  std::string source;  // the peer's IP address, raw bytes
  Phase phase = Phase::kHandshake;
  std::string in;
  size_t head_scan = 0;  // where the search for the head's end resumes
  size_t need = 0;       // bytes that make the request whole, once its head is known
  uint32_t events = 0;   // the epoll interest registered
  Clock::time_point deadline;
  Clock::time_point request_deadline;
  bool keep = true;  // the worker's verdict: serve another request
  Conn() = default;
  Conn(const Conn&) = delete;
  Conn& operator=(const Conn&) = delete;
  ~Conn() {
    if (ssl != nullptr) SSL_free(ssl);
    if (fd >= 0) ::close(fd);
  }
};

int MsUntil(Clock::time_point t) {
  const auto ms = std::chrono::ceil<std::chrono::milliseconds>(t - Clock::now()).count();
  return static_cast<int>(std::clamp<int64_t>(ms, 0, INT_MAX));
}

// Waits for `events` on `fd` until `until`; false on timeout or error.
bool WaitFor(int fd, short events, Clock::time_point until) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int n = ::poll(&p, 1, MsUntil(until));
    if (n > 0) return true;
    if (n == 0 || errno != EINTR) return false;
  }
}

// A worker's view of a connection: the loop's buffered bytes first, then the TLS session.
class ConnStream final : public httplib::Stream {
 public:
  ConnStream(Conn& conn, int io_timeout_ms) : c_(conn), io_timeout_ms_(io_timeout_ms) {}
  bool is_readable() const override {
    return pos_ < c_.in.size() || SSL_pending(c_.ssl) > 0 || WaitFor(c_.fd, POLLIN, ReadUntil());
  }
  bool is_writable() const override { return WaitFor(c_.fd, POLLOUT, WriteUntil()); }
  ssize_t read(char* ptr, size_t size) override {
    if (pos_ < c_.in.size()) {
      const size_t n = std::min(size, c_.in.size() - pos_);
      std::memcpy(ptr, c_.in.data() + pos_, n);
      pos_ += n;
      return static_cast<ssize_t>(n);
    }
    return Io([&] { return SSL_read(c_.ssl, ptr, Clamp(size)); }, ReadUntil());
  }
  ssize_t write(const char* ptr, size_t size) override {
    return Io([&] { return SSL_write(c_.ssl, ptr, Clamp(size)); }, WriteUntil());
  }
  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    Name(&::getpeername, ip, port);
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    Name(&::getsockname, ip, port);
  }
  int socket() const override { return c_.fd; }
  size_t consumed() const { return pos_; }

 private:
  static int Clamp(size_t n) { return static_cast<int>(std::min<size_t>(n, INT_MAX)); }
  Clock::time_point ReadUntil() const {
    return std::min(c_.request_deadline, Clock::now() + std::chrono::milliseconds(io_timeout_ms_));
  }
  Clock::time_point WriteUntil() const {
    return Clock::now() + std::chrono::milliseconds(io_timeout_ms_);
  }
  // Runs an SSL read or write on the non-blocking socket, waiting for what it asks for.
  template <typename Op>
  ssize_t Io(Op op, Clock::time_point until) {
    for (;;) {
      const int n = op();
      if (n > 0) return n;
      const int err = SSL_get_error(c_.ssl, n);
      if (err == SSL_ERROR_ZERO_RETURN) return 0;
      const short want = err == SSL_ERROR_WANT_READ    ? POLLIN
                         : err == SSL_ERROR_WANT_WRITE ? POLLOUT
                                                       : 0;
      if (want == 0 || !WaitFor(c_.fd, want, until)) return -1;
    }
  }
  void Name(int (*get)(int, sockaddr*, socklen_t*), std::string& ip, int& port) const {
    sockaddr_in a{};
    socklen_t len = sizeof(a);
    char text[INET_ADDRSTRLEN] = "";
    if (get(c_.fd, reinterpret_cast<sockaddr*>(&a), &len) == 0 && a.sin_family == AF_INET) {
      inet_ntop(AF_INET, &a.sin_addr, text, sizeof(text));
      port = ntohs(a.sin_port);
    }
    ip = text;
  }

  Conn& c_;
  const int io_timeout_ms_;
  size_t pos_ = 0;
};

}  // namespace

class Front::Impl {
 public:
  Impl(ssl_ctx_st* ctx, FrontOptions options, ServeFn serve)
      : ctx_(ctx), o_(options), serve_(std::move(serve)) {}
  ~Impl();
  absl::Status Listen(const std::string& host, int port);
  void Run();
  void Work();
  ConnectionStats stats() const;

  int port_ = 0;
  std::thread loop_;
  std::vector<std::thread> workers_;

 private:
  void Wake();
  void Accept();
  void Progress(Conn* c);
  bool Complete(Conn* c) const;
  void Dispatch(Conn* c);
  void TakeBack();
  void Expire();
  void Close(Conn* c);
  void Interest(Conn* c, uint32_t events);
  void SetDeadline(Conn* c, Clock::time_point at);
  void PauseAccepting(bool pause);
  void Count(std::atomic<uint64_t>& counter, const char* what);

  SSL_CTX* const ctx_;
  const FrontOptions o_;
  const ServeFn serve_;
  int listen_fd_ = -1;
  int epoll_fd_ = -1;
  int wake_fd_ = -1;
  std::atomic<bool> stop_{false};

  // Loop thread only.
  std::unordered_map<int, std::unique_ptr<Conn>> conns_;  // in the loop, by descriptor
  std::set<std::pair<Clock::time_point, int>> timers_;
  std::map<std::string, int> per_source_;  // open connections, workers' included
  int open_ = 0;
  uint64_t buffered_ = 0;  // bytes in conns_' buffers
  bool paused_ = false;
  Clock::time_point resume_at_ = Clock::time_point::max();  // after EMFILE

  // Loop -> workers, and back.
  std::mutex mu_;
  std::condition_variable ready_cv_;
  std::deque<std::unique_ptr<Conn>> ready_;      // guarded by mu_
  std::vector<std::unique_ptr<Conn>> returned_;  // guarded by mu_
  bool workers_stop_ = false;                    // guarded by mu_

  std::atomic<uint64_t> accepted_{0}, handshake_timeouts_{0}, handshake_failures_{0},
      request_timeouts_{0}, source_refusals_{0}, requests_{0};
};

absl::Status Front::Impl::Listen(const std::string& host, int port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, host.c_str(), &a.sin_addr);
  listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  const int one = 1;
  if (listen_fd_ < 0 ||
      ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0 ||
      ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      ::listen(listen_fd_, o_.listen_backlog) != 0) {
    return absl::UnavailableError(
        absl::StrCat("webhook: cannot listen on ", host, ":", port, ": ", std::strerror(errno)));
  }
  socklen_t len = sizeof(a);
  ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&a), &len);
  port_ = ntohs(a.sin_port);
  epoll_fd_ = ::epoll_create1(EPOLL_CLOEXEC);
  wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (epoll_fd_ < 0 || wake_fd_ < 0) {
    return absl::InternalError(absl::StrCat("webhook: epoll/eventfd: ", std::strerror(errno)));
  }
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = listen_fd_;
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, listen_fd_, &ev);
  ev.data.fd = wake_fd_;
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, wake_fd_, &ev);
  return absl::OkStatus();
}

Front::Impl::~Impl() {
  stop_ = true;
  if (loop_.joinable()) {
    Wake();
    loop_.join();
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    workers_stop_ = true;
  }
  ready_cv_.notify_all();
  for (std::thread& t : workers_) t.join();
  conns_.clear();
  ready_.clear();
  returned_.clear();
  for (int fd : {listen_fd_, epoll_fd_, wake_fd_}) {
    if (fd >= 0) ::close(fd);
  }
}

void Front::Impl::Wake() {
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(wake_fd_, &one, sizeof(one));
}

ConnectionStats Front::Impl::stats() const {
  return {accepted_.load(),         handshake_timeouts_.load(), handshake_failures_.load(),
          request_timeouts_.load(), source_refusals_.load(),    requests_.load()};
}

void Front::Impl::Count(std::atomic<uint64_t>& counter, const char* what) {
  const uint64_t n = ++counter;
  if (n == 1 || n % 100 == 0) {  // a flood of slow clients is logged, not echoed
    WC_LOG_WARN("webhook: %s (%d so far)", what, n);
  }
}

void Front::Impl::Run() {
  std::vector<epoll_event> events(256);
  while (!stop_) {
    Clock::time_point next = resume_at_;
    if (!timers_.empty()) next = std::min(next, timers_.begin()->first);
    const int timeout = next == Clock::time_point::max() ? -1 : MsUntil(next);
    const int n = ::epoll_wait(epoll_fd_, events.data(), static_cast<int>(events.size()), timeout);
    for (int i = 0; i < n; ++i) {
      const int fd = events[i].data.fd;
      if (fd == listen_fd_) {
        Accept();
      } else if (fd == wake_fd_) {
        uint64_t drained = 0;
        [[maybe_unused]] ssize_t r = ::read(wake_fd_, &drained, sizeof(drained));
        TakeBack();
      } else if (auto it = conns_.find(fd); it != conns_.end()) {
        Progress(it->second.get());
      }
    }
    Expire();
    if (Clock::now() >= resume_at_) {
      resume_at_ = Clock::time_point::max();
      if (open_ < o_.max_connections) PauseAccepting(false);
    }
  }
}

void Front::Impl::Accept() {
  for (int i = 0; i < kAcceptsPerWakeup && open_ < o_.max_connections; ++i) {
    sockaddr_in a{};
    socklen_t len = sizeof(a);
    const int fd =
        ::accept4(listen_fd_, reinterpret_cast<sockaddr*>(&a), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EMFILE || errno == ENFILE) {  // until one closes, or 100 ms
        WC_LOG_WARN("webhook: accept: %s: pausing 100 ms", std::strerror(errno));
        PauseAccepting(true);
        resume_at_ = Clock::now() + std::chrono::milliseconds(100);
      }
      if (errno != EINTR && errno != ECONNABORTED) return;
      continue;
    }
    ++accepted_;
    auto c = std::make_unique<Conn>();
    c->fd = fd;
    c->source.assign(reinterpret_cast<const char*>(&a.sin_addr), sizeof(a.sin_addr));
    int& from_source = per_source_[c->source];
    if (from_source >= o_.max_connections_per_source) {
      char text[INET_ADDRSTRLEN] = "";
      inet_ntop(AF_INET, &a.sin_addr, text, sizeof(text));
      Count(source_refusals_, absl::StrCat("a connection from ", text, " refused: it has ",
                                           from_source, " open (--max_connections_per_source)")
                                  .c_str());
      continue;  // c's destructor closes it
    }
    ++from_source;
    ++open_;
    const int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    c->ssl = SSL_new(ctx_);
    if (c->ssl == nullptr || SSL_set_fd(c->ssl, fd) != 1) {
      WC_LOG_ERROR("webhook: SSL_new failed: out of memory?");
      Close(c.release());
      continue;
    }
    SSL_set_accept_state(c->ssl);
    Conn* raw = c.get();
    conns_[fd] = std::move(c);
    Interest(raw, EPOLLIN);
    SetDeadline(raw, Clock::now() + std::chrono::milliseconds(o_.handshake_timeout_ms));
    Progress(raw);  // the ClientHello is often there already
  }
  if (open_ >= o_.max_connections) PauseAccepting(true);
}

void Front::Impl::PauseAccepting(bool pause) {
  if (paused_ == pause) return;
  paused_ = pause;
  epoll_event ev{};
  ev.events = pause ? 0u : static_cast<uint32_t>(EPOLLIN);
  ev.data.fd = listen_fd_;
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, listen_fd_, &ev);
}

void Front::Impl::Interest(Conn* c, uint32_t events) {
  if (c->events == events) return;
  epoll_event ev{};
  ev.events = events;
  ev.data.fd = c->fd;
  ::epoll_ctl(epoll_fd_, c->events == 0 ? EPOLL_CTL_ADD : EPOLL_CTL_MOD, c->fd, &ev);
  c->events = events;
}

void Front::Impl::SetDeadline(Conn* c, Clock::time_point at) {
  timers_.erase({c->deadline, c->fd});
  c->deadline = at;
  timers_.insert({at, c->fd});
}

// Drives the handshake, then reads until the request is whole; any step that would block
// waits for epoll.
void Front::Impl::Progress(Conn* c) {
  auto wait = [&](int ret) {
    const int err = SSL_get_error(c->ssl, ret);
    if (err == SSL_ERROR_WANT_READ) return Interest(c, EPOLLIN), true;
    if (err == SSL_ERROR_WANT_WRITE) return Interest(c, EPOLLOUT), true;
    return false;
  };
  if (c->phase == Phase::kHandshake) {
    const int ret = SSL_do_handshake(c->ssl);
    if (ret != 1) {
      if (!wait(ret)) {
        ++handshake_failures_;
        Close(c);
      }
      return;
    }
    c->phase = Phase::kRequest;
    SetDeadline(c, Clock::now() + std::chrono::milliseconds(o_.idle_timeout_ms));
  }
  char buf[16 << 10];
  while (!Complete(c)) {
    if (buffered_ >= o_.prefetch_budget_bytes && !c->in.empty()) break;  // a worker reads on
    const int n = SSL_read(c->ssl, buf, sizeof(buf));
    if (n <= 0) {
      if (!wait(n)) Close(c);  // closed by the peer, or a TLS error
      return;
    }
    if (c->in.empty()) {
      c->request_deadline = Clock::now() + std::chrono::milliseconds(o_.request_deadline_ms);
      SetDeadline(c, c->request_deadline);
    }
    c->in.append(buf, static_cast<size_t>(n));
    buffered_ += static_cast<uint64_t>(n);
  }
  Dispatch(c);
}

// Whether the buffer holds a request's head and as much of its body as the loop reads.
bool Front::Impl::Complete(Conn* c) const {
  if (c->need == 0) {
    const size_t from = c->head_scan >= 3 ? c->head_scan - 3 : 0;
    const size_t end = c->in.find("\r\n\r\n", from);
    if (end == std::string::npos) {
      c->head_scan = c->in.size();
      return c->in.size() >= kMaxHeadBytes;  // httplib refuses it
    }
    const std::string head = absl::AsciiStrToLower(c->in.substr(0, end + 2));
    uint64_t body = 0;
    const size_t cl = head.find("\ncontent-length:");
    if (cl != std::string::npos) {
      const size_t eol = head.find('\r', cl);
      const std::string value(absl::StripAsciiWhitespace(
          absl::string_view(head).substr(cl + 16, eol == std::string::npos ? 0 : eol - cl - 16)));
      if (!absl::SimpleAtoi(value, &body)) body = 0;  // httplib answers a bad length
    }
    if (body > o_.prefetch_body_bytes || head.find("\ntransfer-encoding:") != std::string::npos ||
        head.find("\nexpect:") != std::string::npos) {
      body = 0;  // the worker reads it (or answers 413 or 100 first)
    }
    c->need = end + 4 + body;
  }
  return c->in.size() >= c->need;
}

void Front::Impl::Dispatch(Conn* c) {
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, c->fd, nullptr);
  c->events = 0;
  timers_.erase({c->deadline, c->fd});
  buffered_ -= c->in.size();
  c->phase = Phase::kWorker;
  ++requests_;
  auto it = conns_.find(c->fd);
  std::unique_ptr<Conn> owned = std::move(it->second);
  conns_.erase(it);
  {
    std::lock_guard<std::mutex> lock(mu_);
    ready_.push_back(std::move(owned));
  }
  ready_cv_.notify_one();
}

void Front::Impl::Work() {
  for (;;) {
    std::unique_ptr<Conn> c;
    {
      std::unique_lock<std::mutex> lock(mu_);
      ready_cv_.wait(lock, [&] { return workers_stop_ || !ready_.empty(); });
      if (ready_.empty()) return;
      c = std::move(ready_.front());
      ready_.pop_front();
    }
    ConnStream stream(*c, o_.io_timeout_ms);
    bool closed = false;
    c->keep = serve_(stream, /*close=*/stop_.load(), closed) && !closed && !stop_;
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

void Front::Impl::TakeBack() {
  std::vector<std::unique_ptr<Conn>> back;
  {
    std::lock_guard<std::mutex> lock(mu_);
    back.swap(returned_);
  }
  for (std::unique_ptr<Conn>& owned : back) {
    Conn* c = owned.get();
    conns_[c->fd] = std::move(owned);
    if (!c->keep) {
      SSL_shutdown(c->ssl);  // close_notify, once, without waiting
      Close(c);
      continue;
    }
    c->phase = Phase::kRequest;
    buffered_ += c->in.size();
    Interest(c, EPOLLIN);
    SetDeadline(c, c->in.empty() ? Clock::now() + std::chrono::milliseconds(o_.idle_timeout_ms)
                                 : c->request_deadline);
    Progress(c);  // a pipelined request may be whole already, or inside the TLS session
  }
}

void Front::Impl::Expire() {
  const Clock::time_point now = Clock::now();
  while (!timers_.empty() && timers_.begin()->first <= now) {
    Conn* c = conns_.at(timers_.begin()->second).get();
    if (c->phase == Phase::kHandshake) {
      Count(handshake_timeouts_,
            "a TLS handshake was not done in time: closed "
            "(--handshake_timeout_ms)");
    } else if (!c->in.empty()) {
      Count(request_timeouts_,
            "a request did not arrive whole in time: closed "
            "(--connection_deadline_ms)");
    }
    Close(c);
  }
}

void Front::Impl::Close(Conn* c) {
  std::unique_ptr<Conn> owned;
  if (auto it = conns_.find(c->fd); it != conns_.end()) {
    owned = std::move(it->second);
    conns_.erase(it);
  } else {
    owned.reset(c);  // never registered
  }
  if (c->events != 0) ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, c->fd, nullptr);
  timers_.erase({c->deadline, c->fd});
  if (c->phase != Phase::kWorker) buffered_ -= c->in.size();
  if (auto it = per_source_.find(c->source); it != per_source_.end() && --it->second <= 0) {
    per_source_.erase(it);
  }
  --open_;
  if (open_ < o_.max_connections) PauseAccepting(false);
}

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
      options.num_threads < 1) {
    return absl::InvalidArgumentError(
        "webhook: the listen backlog, timeouts, connection limits and threads must be >= 1");
  }
  auto impl = std::make_unique<Impl>(ctx, options, std::move(serve));
  if (absl::Status s = impl->Listen(host, port); !s.ok()) return s;
  Impl* raw = impl.get();
  for (int i = 0; i < options.num_threads; ++i) raw->workers_.emplace_back([raw] { raw->Work(); });
  raw->loop_ = std::thread([raw] { raw->Run(); });
  return std::unique_ptr<Front>(new Front(std::move(impl)));
}

}  // namespace weightcache::webhook::internal
