// The webhook front's inside (front.h), shared by its two halves: front.cc (accepting, TLS,
// reading requests whole, the loop) and front_workers.cc (the per-source queues, the workers,
// sending answers, deadlines). Not a public header.
//
// Thread-safety: as front.h says: the loop thread owns the connections in `conns_`; a
// connection in the queue or with a worker is owned there, under `mu_`.
#pragma once

#include <arpa/inet.h>
#include <httplib.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/ssl.h>
#include <signal.h>
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
#include "absl/strings/str_cat.h"
#include "pkg/net/acceptor.h"
#include "pkg/util/errno_status.h"
#include "pkg/util/log.h"
#include "pkg/util/scoped_fd.h"
#include "pkg/webhook/internal/front.h"
#include "pkg/webhook/internal/http_head.h"

namespace weightcache::webhook::internal {

using Clock = std::chrono::steady_clock;
constexpr size_t kMaxHeadBytes = 64 << 10;
constexpr auto kLinger = std::chrono::milliseconds(1000);
constexpr size_t kLingerBytes = 1 << 20;
constexpr size_t kReadBytes = 16 << 10;

// kHandshake -> kRequest -> kQueued -> kWorker -> kWriting -> kRequest (kept alive) or kClosing.
// An error answer goes from any loop phase to kWriting, then kClosing.
enum class Phase { kHandshake, kRequest, kQueued, kWorker, kWriting, kClosing };

// One connection: its socket and TLS session, the bytes read but not yet served and the answer
// not yet sent. Owned by the loop, by the queue, or by one worker while it serves a request.
struct Conn {
  int fd = -1;
  SSL* ssl = nullptr;
  std::string source;            // the peer's IP address, as text: its cap's and queue's key
  net::KeyedLimiter::Slot slot;  // its place in the door's caps: given back with the Conn
  // The door's idle clock: busy from the accept until the connection waits, kept alive, for
  // its next request (then the door ends it after idle_timeout_ms). Let go before fd closes.
  net::ActivityHandle activity;
  Phase phase = Phase::kHandshake;
  std::string in;
  std::string out;
  size_t head_scan = 0;  // where the search for the head's end resumes
  size_t need = 0;       // bytes that make the request whole, once its head is known
  size_t counted = 0;    // bytes of `in` and `out` counted in the loop's total
  size_t dropped = 0;    // bytes read and dropped while closing
  uint32_t events = 0;   // the epoll interest registered
  Clock::time_point deadline;
  bool keep = true;  // the worker's verdict: serve another request after this answer
  Conn() = default;
  Conn(const Conn&) = delete;
  Conn& operator=(const Conn&) = delete;
  ~Conn() {
    activity.Reset();  // the door never touches the descriptor number once it closes
    if (ssl != nullptr) SSL_free(ssl);
    if (fd >= 0) ::close(fd);
  }
};

inline int MsUntil(Clock::time_point t) {
  const auto ms = std::chrono::ceil<std::chrono::milliseconds>(t - Clock::now()).count();
  return static_cast<int>(std::clamp<int64_t>(ms, 0, INT_MAX));
}

// A worker's view of a connection: the request the loop framed (its first `c.need` buffered
// bytes; what follows is the end of the stream), and a buffer for the answer. Nothing here
// touches the socket but getpeername and getsockname.
class ConnStream final : public httplib::Stream {
 public:
  explicit ConnStream(Conn& conn) : c_(conn) {}
  bool is_readable() const override { return pos_ < c_.need; }
  bool is_writable() const override { return true; }
  ssize_t read(char* ptr, size_t size) override {
    const size_t n = std::min(size, c_.need - pos_);  // 0 past the request: end of stream
    std::memcpy(ptr, c_.in.data() + pos_, n);
    pos_ += n;
    return static_cast<ssize_t>(n);
  }
  ssize_t write(const char* ptr, size_t size) override {
    c_.out.append(ptr, size);
    return static_cast<ssize_t>(size);
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
  size_t pos_ = 0;
};

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
  void Open(net::Accepted a);
  bool CloseOldestHandshake();
  void Refused(const std::string& reason);
  void Progress(Conn* c);
  void ReadRequest(Conn* c);
  bool MakeRoom(Conn* c);
  void Enqueue(Conn* c);
  void TakeBack();
  void Flush(Conn* c);
  void Drain(Conn* c);
  void Refuse(Conn* c, int status, const std::string& why, std::atomic<uint64_t>& counter);
  void Expire();
  void ExpireQueued(Clock::time_point now);
  void Close(Conn* c);
  void Interest(Conn* c, uint32_t events);
  void Unwatch(Conn* c);
  void SetDeadline(Conn* c, Clock::time_point at);
  // Kept alive with nothing buffered: no deadline of the loop's; the door's idle clock runs.
  void AwaitRequest(Conn* c);
  void Account(Conn* c);
  void Count(std::atomic<uint64_t>& counter, const std::string& what);

  SSL_CTX* const ctx_;
  const FrontOptions o_;
  const ServeFn serve_;
  std::unique_ptr<net::Acceptor> acceptor_;  // run inline by the loop
  int epoll_fd_ = -1;
  int wake_fd_ = -1;
  std::atomic<bool> stop_{false};     // the loop ends
  std::atomic<bool> closing_{false};  // answers ask for "Connection: close"

  // Loop thread only.
  std::unordered_map<int, std::unique_ptr<Conn>> conns_;  // in the loop, by descriptor
  std::set<std::pair<Clock::time_point, int>> timers_;    // queued connections' included
  uint64_t buffered_ = 0;  // bytes in every connection's buffers, queued and workers' included

  // Loop -> workers, and back. Complete requests wait in one queue per source address; workers
  // take from the addresses in turn (`turns_` names each address with requests waiting once).
  std::mutex mu_;
  std::condition_variable ready_cv_;
  std::map<std::string, std::deque<std::unique_ptr<Conn>>> waiting_;  // guarded by mu_
  std::deque<std::string> turns_;                                     // guarded by mu_
  std::vector<std::unique_ptr<Conn>> returned_;                       // guarded by mu_
  bool workers_stop_ = false;                                         // guarded by mu_

  std::atomic<uint64_t> accepted_{0}, handshake_timeouts_{0}, handshake_failures_{0},
      request_timeouts_{0}, source_refusals_{0}, total_refusals_{0}, descriptor_backoffs_{0},
      idle_closes_{0}, requests_{0}, refused_heads_{0}, queue_refusals_{0}, queue_timeouts_{0},
      buffer_cuts_{0}, answer_timeouts_{0};
  std::atomic<uint64_t> waiting_now_{0}, buffered_now_{0};  // copies for stats()
};

}  // namespace weightcache::webhook::internal
