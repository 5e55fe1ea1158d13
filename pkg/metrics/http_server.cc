#include "pkg/metrics/http_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstring>
#include <deque>
#include <exception>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "pkg/net/acceptor.h"
#include "pkg/util/epoll_loop.h"
#include "pkg/util/errno_status.h"
#include "pkg/util/log.h"
#include "pkg/util/scoped_fd.h"
#include "pkg/util/status_macros.h"
#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"
#include "prometheus/text_serializer.h"

namespace weightcache::metrics {
namespace {

using Clock = std::chrono::steady_clock;

constexpr const char* kMetricsContentType = "text/plain; version=0.0.4; charset=utf-8";
constexpr const char* kTextContentType = "text/plain; charset=utf-8";
constexpr uint64_t kWakeId = 0;
constexpr uint64_t kAcceptorId = 1;
constexpr int kBacklog = 128;

struct ListenAddress {
  sockaddr_storage addr;
  socklen_t len = 0;
};

const char* ReasonPhrase(int code) {
  switch (code) {
    case 200:
      return "OK";
    case 400:
      return "Bad Request";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 431:
      return "Request Header Fields Too Large";
    case 500:
      return "Internal Server Error";
    case 503:
      return "Service Unavailable";
    default:
      return "Unknown";
  }
}

// A complete response; the body only when `with_body` (not for HEAD).
std::string Response(int code, const char* content_type, const std::string& body, bool with_body) {
  std::string out =
      absl::StrCat("HTTP/1.1 ", code, " ", ReasonPhrase(code), "\r\nContent-Type: ", content_type,
                   "\r\nContent-Length: ", body.size(),
                   "\r\nCache-Control: no-store\r\nConnection: close\r\n\r\n");
  if (with_body) out += body;
  return out;
}

bool AllDigits(const std::string& s) {
  if (s.empty() || s.size() > 5) return false;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
  }
  return true;
}

// Validates "IPv4:port" / "[IPv6]:port" ("8080s", "a,b", "+8080" and host names are refused).
absl::StatusOr<ListenAddress> ParseAddress(const std::string& address) {
  auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics address \"", address, "\": ", why,
                     " (want IPv4:port or [IPv6]:port, e.g. 0.0.0.0:9464)"));
  };
  std::string host;
  std::string port;
  bool v6 = false;
  if (!address.empty() && address.front() == '[') {
    const size_t close = address.find("]:");
    if (close == std::string::npos) return bad("no \"]:port\" after an IPv6 address");
    host = address.substr(1, close - 1);
    port = address.substr(close + 2);
    v6 = true;
  } else {
    const size_t colon = address.rfind(':');
    if (colon == std::string::npos) return bad("no port");
    host = address.substr(0, colon);
    port = address.substr(colon + 1);
  }
  if (!AllDigits(port) || std::stoi(port) > 65535) return bad("port is not a number 0..65535");
  ListenAddress out;
  std::memset(&out.addr, 0, sizeof(out.addr));
  if (v6) {
    auto* sa = reinterpret_cast<sockaddr_in6*>(&out.addr);
    sa->sin6_family = AF_INET6;
    if (inet_pton(AF_INET6, host.c_str(), &sa->sin6_addr) != 1) {
      return bad(absl::StrCat("\"", host, "\" is not a numeric IPv6 address"));
    }
    sa->sin6_port = htons(static_cast<uint16_t>(std::stoi(port)));
    out.len = sizeof(sockaddr_in6);
  } else {
    auto* sa = reinterpret_cast<sockaddr_in*>(&out.addr);
    sa->sin_family = AF_INET;
    if (inet_pton(AF_INET, host.c_str(), &sa->sin_addr) != 1) {
      return bad(absl::StrCat("\"", host, "\" is not a numeric IPv4 address"));
    }
    sa->sin_port = htons(static_cast<uint16_t>(std::stoi(port)));
    out.len = sizeof(sockaddr_in);
  }
  return out;
}

// The source address of `fd`'s peer, as text: the cap's key.
absl::StatusOr<net::Identity> SourceOf(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) {
    return ErrnoStatus(errno, "getpeername");
  }
  char text[INET6_ADDRSTRLEN] = "";
  const void* a = ss.ss_family == AF_INET6
                      ? static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(&ss)->sin6_addr)
                      : static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(&ss)->sin_addr);
  if (inet_ntop(ss.ss_family, a, text, sizeof(text)) == nullptr) {
    return ErrnoStatus(errno, "inet_ntop");
  }
  return net::Identity{text, text, {}};
}

int MsUntil(Clock::time_point t, Clock::time_point now) {
  if (t <= now) return 0;
  const auto ms = std::chrono::ceil<std::chrono::milliseconds>(t - now).count();
  return static_cast<int>(std::min<int64_t>(ms, INT_MAX));
}

}  // namespace

// The event loop (one thread: the acceptor run inline, every connection's head and answer) and
// the /metrics render workers.
class HttpServer::Loop {
 public:
  Loop(const HttpServer* server, const HttpServerOptions& o, ScopedFd epoll, ScopedFd wake)
      : server_(server), options_(o), epoll_(std::move(epoll)), wake_(std::move(wake)) {}

  absl::Status Start(ScopedFd listening) {
    net::ListenerOptions a;
    a.name = "metrics";
    a.limits = {.total = options_.max_connections,
                .per_key = options_.max_connections_per_source,
                .over_cap = 0,
                .own_caps = {}};
    a.first_byte = options_.head_timeout;
    a.own_thread = false;  // run by this loop: serve touches its connections without locks
    a.identify = [](int fd, const std::string&) { return SourceOf(fd); };
    a.serve = [this](net::Accepted c) {
      Take(std::move(c));
      return true;
    };
    a.tell_refused = [](int fd, const std::string&, const std::string& message) {
      const std::string r =
          Response(503, kTextContentType, absl::StrCat("refused: ", message, "\n"), true);
      (void)::send(fd, r.data(), r.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    };
    WC_ASSIGN_OR_RETURN(acceptor_, net::Acceptor::Start(std::move(a)));
    WC_RETURN_IF_ERROR(acceptor_->Listen(std::move(listening), ""));
    for (auto [fd, id] :
         {std::pair{wake_.get(), kWakeId}, std::pair{acceptor_->fd(), kAcceptorId}}) {
      epoll_event ev{};
      ev.events = EPOLLIN;
      ev.data.u64 = id;
      if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, fd, &ev) != 0) {
        return ErrnoStatus(errno, "epoll_ctl");
      }
    }
    for (int i = 0; i < options_.num_threads; ++i) workers_.emplace_back([this] { Render(); });
    thread_ = std::thread([this] { Run(); });
    return absl::OkStatus();
  }

  ~Loop() {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    Wake();
    for (std::thread& t : workers_) t.join();
    if (thread_.joinable()) thread_.join();
    if (acceptor_ != nullptr) acceptor_->Stop();
  }

  ListenerSnapshot listener() const {
    net::Acceptor::Counters c = acceptor_->counters();
    c.refused["head_deadline"] = head_deadline_.load();
    c.refused["bad_request"] = bad_request_.load();
    return {"metrics", c.open, c.accepted, std::move(c.refused)};
  }

 private:
  struct Conn {
    net::Accepted door;  // the socket and its place in the caps
    std::string in;
    std::string out;
    size_t sent = 0;
    bool answered = false;  // the head is read: `out` is (or will be) the answer
    Clock::time_point deadline;
  };

  void Wake() {
    const uint64_t one = 1;
    (void)::write(wake_.get(), &one, sizeof one);
  }

  void Take(net::Accepted a) {
    const uint64_t id = next_id_++;
    auto c = std::make_unique<Conn>();
    c->deadline = a.accepted + options_.head_timeout;
    c->door = std::move(a);
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP;
    ev.data.u64 = id;
    if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, c->door.fd.get(), &ev) != 0) return;  // closed
    Conn& ref = *c;
    conns_.emplace(id, std::move(c));
    ReadHead(id, ref);  // its first bytes are there already
  }

  void Close(uint64_t id) { conns_.erase(id); }  // the descriptor leaves epoll as it closes

  void ReadHead(uint64_t id, Conn& c) {
    char buf[4096];
    for (;;) {
      const ssize_t n = ::recv(c.door.fd.get(), buf, sizeof buf, 0);
      if (n == 0) return Close(id);  // gone before its head was whole
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) break;
        return Close(id);
      }
      c.in.append(buf, static_cast<size_t>(n));
      const size_t end = c.in.find("\r\n\r\n");
      if (end != std::string::npos && end + 4 <= options_.max_head_bytes) return Answer(id, c);
      if (c.in.size() >= options_.max_head_bytes) {
        ++bad_request_;
        return Send(
            id, c,
            Response(431, kTextContentType,
                     absl::StrCat("request head over ", options_.max_head_bytes, " bytes\n"),
                     true));
      }
    }
  }

  // The head is whole: the answer, from here for the probes, from a worker for /metrics.
  void Answer(uint64_t id, Conn& c) {
    c.answered = true;
    c.deadline = Clock::now() + options_.response_timeout;
    const size_t line_end = c.in.find("\r\n");
    const std::string line = c.in.substr(0, line_end);
    const size_t sp1 = line.find(' ');
    const size_t sp2 = sp1 == std::string::npos ? sp1 : line.find(' ', sp1 + 1);
    if (sp2 == std::string::npos || line.compare(sp2 + 1, 5, "HTTP/") != 0) {
      ++bad_request_;
      return Send(id, c, Response(400, kTextContentType, "not an HTTP/1.x request\n", true));
    }
    const std::string method = line.substr(0, sp1);
    std::string path = line.substr(sp1 + 1, sp2 - sp1 - 1);
    path = path.substr(0, path.find('?'));
    const bool head = method == "HEAD";
    const bool known = path == "/metrics" || path == "/healthz" || path == "/readyz";
    if (!known) return Send(id, c, Response(404, kTextContentType, "not found\n", !head));
    if (method != "GET" && !head) {
      return Send(id, c, Response(405, kTextContentType, "only GET and HEAD\n", true));
    }
    if (path == "/healthz") return Send(id, c, Response(200, kTextContentType, "ok\n", !head));
    if (path == "/readyz") return Send(id, c, Ready(!head));
    // Nothing more is read: the connection waits, unwatched, for its rendered answer.
    epoll_event ev{};
    ev.events = 0;
    ev.data.u64 = id;
    (void)::epoll_ctl(epoll_.get(), EPOLL_CTL_MOD, c.door.fd.get(), &ev);
    absl::MutexLock lock(&mu_);
    to_render_.emplace_back(id, !head);
  }

  std::string Ready(bool with_body) const {
    try {
      auto [ready, reason] = server_->CheckReady();
      if (ready) return Response(200, kTextContentType, "ready\n", with_body);
      return Response(503, kTextContentType, absl::StrCat("not ready: ", reason, "\n"), with_body);
    } catch (const std::exception& e) {
      return Response(503, kTextContentType,
                      absl::StrCat("not ready: readiness check threw: ", e.what(), "\n"),
                      with_body);
    }
  }

  void Send(uint64_t id, Conn& c, std::string out) {
    c.answered = true;
    c.out = std::move(out);
    c.sent = 0;
    Write(id, c);
  }

  void Write(uint64_t id, Conn& c) {
    while (c.sent < c.out.size()) {
      const ssize_t n = ::send(c.door.fd.get(), c.out.data() + c.sent, c.out.size() - c.sent,
                               MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        epoll_event ev{};
        ev.events = EPOLLOUT;
        ev.data.u64 = id;
        (void)::epoll_ctl(epoll_.get(), EPOLL_CTL_MOD, c.door.fd.get(), &ev);
        return;
      }
      if (n <= 0) return Close(id);
      c.sent += static_cast<size_t>(n);
    }
    (void)::shutdown(c.door.fd.get(), SHUT_WR);
    Close(id);
  }

  void OnEvent(uint64_t id, uint32_t events) {
    if (id == kWakeId) {
      uint64_t v;
      (void)::read(wake_.get(), &v, sizeof v);
      return;
    }
    if (id == kAcceptorId) return;  // the loop runs the acceptor on every pass
    auto it = conns_.find(id);
    if (it == conns_.end()) return;  // closed earlier in this batch
    Conn& c = *it->second;
    if (!c.answered) {
      ReadHead(id, c);
    } else if (!c.out.empty()) {
      Write(id, c);
    } else if (events & (EPOLLHUP | EPOLLERR)) {
      Close(id);
    }
  }

  // Rendered answers back to their connections; deadlines.
  void Tick(Clock::time_point now) {
    std::vector<std::pair<uint64_t, std::string>> done;
    {
      absl::MutexLock lock(&mu_);
      done.swap(rendered_);
    }
    for (auto& [id, out] : done) {
      auto it = conns_.find(id);
      if (it != conns_.end()) Send(id, *it->second, std::move(out));
    }
    for (auto it = conns_.begin(); it != conns_.end();) {
      if (it->second->deadline > now) {
        ++it;
        continue;
      }
      if (!it->second->answered) ++head_deadline_;
      it = conns_.erase(it);
    }
  }

  int TimeoutMs(Clock::time_point now) const {
    int ms = acceptor_->TimeoutMs();
    for (const auto& [id, c] : conns_) {
      const int left = MsUntil(c->deadline, now) + 1;
      if (ms < 0 || left < ms) ms = left;
    }
    return ms;
  }

  void Run() {
    EpollWaiter waiter("metrics http");
    epoll_event events[64];
    for (;;) {
      {
        absl::MutexLock lock(&mu_);
        if (stop_) break;
      }
      Tick(Clock::now());
      const int n = waiter.Wait(epoll_.get(), events, 64, TimeoutMs(Clock::now()));
      for (int i = 0; i < n; ++i) OnEvent(events[i].data.u64, events[i].events);
      acceptor_->Run();
    }
    conns_.clear();
  }

  void Render() {
    for (;;) {
      std::pair<uint64_t, bool> job;
      {
        absl::MutexLock lock(&mu_);
        mu_.Await(absl::Condition(
            +[](Loop* l) ABSL_EXCLUSIVE_LOCKS_REQUIRED(l->mu_) {
              return l->stop_ || !l->to_render_.empty();
            },
            this));
        if (stop_) return;
        job = to_render_.front();
        to_render_.pop_front();
      }
      std::string out;
      try {
        out = Response(200, kMetricsContentType, server_->RenderMetrics(), job.second);
      } catch (const std::exception& e) {
        WC_LOG_ERROR("metrics http: /metrics: %s", e.what());
        out = Response(500, kTextContentType, absl::StrCat("collect failed: ", e.what(), "\n"),
                       job.second);
      }
      {
        absl::MutexLock lock(&mu_);
        rendered_.emplace_back(job.first, std::move(out));
      }
      Wake();
    }
  }

  const HttpServer* const server_;
  const HttpServerOptions options_;
  ScopedFd epoll_;
  ScopedFd wake_;
  std::unique_ptr<net::Acceptor> acceptor_;
  std::thread thread_;
  std::vector<std::thread> workers_;
  std::atomic<uint64_t> head_deadline_{0};
  std::atomic<uint64_t> bad_request_{0};

  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::deque<std::pair<uint64_t, bool>> to_render_ ABSL_GUARDED_BY(mu_);  // (conn, with body)
  std::vector<std::pair<uint64_t, std::string>> rendered_ ABSL_GUARDED_BY(mu_);

  // The loop thread's.
  std::map<uint64_t, std::unique_ptr<Conn>> conns_;
  uint64_t next_id_ = 2;
};

HttpServer::HttpServer(std::string address, ReadinessCheck readiness)
    : address_(std::move(address)), readiness_(std::move(readiness)) {}

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(HttpServerOptions options) {
  absl::StatusOr<ListenAddress> listen = ParseAddress(options.address);
  if (!listen.ok()) return listen.status();
  if (options.num_threads < 1 || options.max_connections < 1 ||
      options.max_connections_per_source < 1 || options.head_timeout.count() < 1 ||
      options.max_head_bytes < 64 || options.response_timeout.count() < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "metrics http: num_threads (", options.num_threads, "), max_connections (",
        options.max_connections, "), max_connections_per_source (",
        options.max_connections_per_source, "), head_timeout (", options.head_timeout.count(),
        " ms) and response_timeout (", options.response_timeout.count(),
        " ms) must be >= 1, max_head_bytes (", options.max_head_bytes, ") >= 64"));
  }
  auto unavailable = [&](int err, const char* call) {
    return absl::UnavailableError(absl::StrCat("metrics http: cannot listen on \"", options.address,
                                               "\": ", call, ": ", std::strerror(err)));
  };
  ScopedFd fd(::socket(listen->addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd) return unavailable(errno, "socket");
  const int on = 1;
  (void)::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
  if (listen->addr.ss_family == AF_INET6) {
    (void)::setsockopt(fd.get(), IPPROTO_IPV6, IPV6_V6ONLY, &on, sizeof on);
  }
  if (::bind(fd.get(), reinterpret_cast<const sockaddr*>(&listen->addr), listen->len) != 0) {
    return unavailable(errno, "bind");
  }
  if (::listen(fd.get(), kBacklog) != 0) return unavailable(errno, "listen");
  sockaddr_storage bound{};
  socklen_t bound_len = sizeof(bound);
  if (::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&bound), &bound_len) != 0) {
    return unavailable(errno, "getsockname");
  }
  std::unique_ptr<HttpServer> server(new HttpServer(options.address, std::move(options.readiness)));
  server->port_ =
      ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                        : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  ScopedFd epoll(::epoll_create1(EPOLL_CLOEXEC));
  if (!epoll) return ErrnoStatus(errno, "metrics http: epoll_create1");
  ScopedFd wake(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wake) return ErrnoStatus(errno, "metrics http: eventfd");
  server->loop_ = std::make_unique<Loop>(server.get(), options, std::move(epoll), std::move(wake));
  WC_RETURN_IF_ERROR(server->loop_->Start(std::move(fd)));
  WC_LOG_INFO("metrics http: serving /metrics /healthz /readyz on %s (port %d)", server->address_,
              server->port_);
  return server;
}

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(const std::string& address) {
  HttpServerOptions options;
  options.address = address;
  return Start(std::move(options));
}

HttpServer::~HttpServer() { loop_.reset(); }  // first: nothing is called after this

ListenerSnapshot HttpServer::listener() const { return loop_->listener(); }

void HttpServer::RegisterCollectable(std::weak_ptr<prometheus::Collectable> collectable) {
  absl::MutexLock lock(&mu_);
  collectables_.push_back(std::move(collectable));
}

void HttpServer::SetReadinessCheck(ReadinessCheck check) {
  absl::MutexLock lock(&mu_);
  readiness_ = std::move(check);
}

std::string HttpServer::RenderMetrics() const {
  std::vector<std::shared_ptr<prometheus::Collectable>> live;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& weak : collectables_) {
      if (auto c = weak.lock()) live.push_back(std::move(c));
    }
  }
  // Collect outside the lock: collectables may take their own locks and take time.
  std::vector<prometheus::MetricFamily> families;
  for (const auto& c : live) {
    std::vector<prometheus::MetricFamily> f = c->Collect();
    families.insert(families.end(), std::make_move_iterator(f.begin()),
                    std::make_move_iterator(f.end()));
  }
  std::ostringstream out;
  prometheus::TextSerializer().Serialize(out, families);
  return out.str();
}

std::pair<bool, std::string> HttpServer::CheckReady() const {
  ReadinessCheck check;
  {
    absl::MutexLock lock(&mu_);
    check = readiness_;
  }
  if (!check) return {false, "readiness check not set"};
  return check();
}

}  // namespace weightcache::metrics
