#include "pkg/server/wire/peer_port.h"

#include <linux/sockios.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "pkg/net/descriptors.h"
#include "pkg/net/splice.h"
#include "pkg/server/wire/peer_port_sockets.h"
#include "pkg/util/epoll_loop.h"
#include "pkg/util/errno_status.h"
#include "pkg/util/log.h"
#include "pkg/util/status_macros.h"

namespace weightcache::server {
namespace {

using Clock = std::chrono::steady_clock;

constexpr size_t kBufferBytes = 32 << 10;  // two TLS records of the largest size
constexpr int kBackoffMs = 100;            // hand-overs, after EMFILE/ENFILE
// gRPC 1.51's listener stops accepting for good after one EMFILE (measured; later releases
// retry), so gRPC must never be the one that finds the descriptor table full. A connection is
// handed to it only while this many descriptors are free (the relay's socket, gRPC's accepted
// end, and a margin for the process's other threads), and until gRPC has read the bytes
// passed to it (so accepted it: SIOCOUTQ of the relay's end is 0) this thread takes no
// descriptor at all: no accept, no hand-over, no probe (a failing probe holds every free
// descriptor for a moment).
constexpr int kHeadroom = 8;
constexpr int kUnreadRetryMs = 1;  // how often to look whether gRPC has read
constexpr int kBacklog = 1024;
constexpr uint64_t kWakeId = ~uint64_t{0};
constexpr uint64_t kAcceptorId = ~uint64_t{0} - 1;

constexpr char kHandshake[] = "handshake_deadline";
constexpr char kNotTls[] = "not_tls";
constexpr char kHandover[] = "handover";

void Wake(int fd) {
  uint64_t one = 1;
  (void)::write(fd, &one, sizeof one);
}

}  // namespace

struct PeerPort::Conn {
  uint64_t id = 0;
  TcpSource from;  // the IP (the per-address cap's key) and what logs and SourceOf name
  net::KeyedLimiter::Slot place;  // in the acceptor's caps, until the connection closes
  std::string name;               // gRPC's peer string for the relay's socket ("unix-abstract:...")
  // The client's socket and the relay's end of the connection to gRPC (none until the
  // hand-over: the client's first bytes wait); its inner side done: gRPC closed its end.
  net::Splice splice{ScopedFd(), kBufferBytes, /*lazy_buffers=*/true};
  TlsRecordScanner from_client{/*first_must_be_handshake=*/true};
  TlsRecordScanner from_server{/*first_must_be_handshake=*/false};
  bool client_watched = false;
  bool inner_watched = false;
  bool waiting = false;           // in waiting_: its first bytes are in, gRPC not yet asked
  bool client_sent_data = false;  // a complete application-data record came from the client
  bool established = false;       // ... and the server answered with application data
  bool server_spoke = false;      // any byte came from gRPC
  const char* closed_for = nullptr;
};

absl::StatusOr<std::unique_ptr<PeerPort>> PeerPort::Start(Options options) {
  int port = 0;
  auto listening = ListenTcp(options.listen, kBacklog, &port);
  if (!listening.ok()) {
    return absl::UnavailableError(absl::StrCat("peer API: cannot listen on ", options.listen,
                                               " (--peer_listen): ", listening.status().message()));
  }
  ScopedFd epoll(::epoll_create1(EPOLL_CLOEXEC));
  if (!epoll) return ErrnoStatus(errno, "epoll_create1");
  ScopedFd wake(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wake) return ErrnoStatus(errno, "eventfd");
  auto p = std::unique_ptr<PeerPort>(
      new PeerPort(std::move(options), port, std::move(epoll), std::move(wake)));
  net::ListenerOptions a;
  a.name = "peer";
  a.limits = {.total = p->options_.max_connections,
              .per_key = p->options_.max_connections_per_address,
              .over_cap = 0,
              .own_caps = {}};
  a.first_byte = p->options_.handshake_timeout;
  a.idle = p->options_.idle;
  a.own_thread = false;  // run by the port's loop: make_room and serve touch its state
  a.identify = [raw = p.get()](int fd, const std::string&) { return raw->Identify(fd); };
  a.serve = [raw = p.get()](net::Accepted c) {
    raw->Take(std::move(c));
    return true;
  };
  a.make_room = [raw = p.get()] { return raw->MakeRoom(); };
  WC_ASSIGN_OR_RETURN(p->acceptor_, net::Acceptor::Start(std::move(a)));
  for (ScopedFd& fd : *listening) WC_RETURN_IF_ERROR(p->acceptor_->Listen(std::move(fd), ""));
  for (auto [fd, id] :
       {std::pair{p->wake_.get(), kWakeId}, std::pair{p->acceptor_->fd(), kAcceptorId}}) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = id;
    if (::epoll_ctl(p->epoll_.get(), EPOLL_CTL_ADD, fd, &ev) != 0) {
      return ErrnoStatus(errno, "epoll_ctl");
    }
  }
  p->thread_ = std::thread(&PeerPort::Loop, p.get());
  return p;
}

PeerPort::PeerPort(Options options, int port, ScopedFd epoll, ScopedFd wake)
    : options_(std::move(options)), port_(port), epoll_(std::move(epoll)), wake_(std::move(wake)) {
  MutexLock l(mu_);
  for (const char* reason : {kHandshake, kNotTls, kHandover}) counters_.refused[reason] = 0;
}

PeerPort::~PeerPort() {
  stop_ = true;
  Wake(wake_.get());
  if (thread_.joinable()) thread_.join();
  if (acceptor_ != nullptr) acceptor_->Stop();
}

void PeerPort::StopAccepting() {
  stop_accepting_ = true;
  Wake(wake_.get());
  MutexLock l(mu_);
  while (!accepting_stopped_ && !loop_ended_) cv_.Wait(mu_);
}

void PeerPort::CloseConnections() {
  stop_accepting_ = true;
  close_all_ = true;
  Wake(wake_.get());
  MutexLock l(mu_);
  while (!connections_closed_ && !loop_ended_) cv_.Wait(mu_);
}

std::string PeerPort::SourceOf(const std::string& grpc_peer) const {
  MutexLock l(mu_);
  auto it = sources_.find(grpc_peer);
  return it == sources_.end() ? grpc_peer : it->second;
}

PeerPort::Counters PeerPort::counters() const {
  Counters c;
  {
    MutexLock l(mu_);
    c = counters_;
  }
  const net::Acceptor::Counters door = acceptor_->counters();
  c.open = door.open;
  c.accepted = door.accepted;
  for (const auto& [reason, n] : door.refused) c.refused[reason] += n;
  return c;
}

absl::StatusOr<net::Identity> PeerPort::Identify(int fd) const {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) {
    return ErrnoStatus(errno, "getpeername");  // gone already
  }
  TcpSource from = TcpSourceOf(ss);
  net::Identity id{from.address, from.source, {}};
  id.detail = std::move(from);
  return id;
}

void PeerPort::Take(net::Accepted a) {
  const int one = 1;
  (void)::setsockopt(a.fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  auto c = std::make_unique<Conn>();
  c->id = next_id_++;
  c->from = std::any_cast<TcpSource>(std::move(a.who.detail));
  c->splice = net::Splice(std::move(a.fd), kBufferBytes, /*lazy_buffers=*/true);
  c->splice.SetActivity(std::move(a.activity));
  c->place = std::move(a.slot);
  Watch(*c);  // its first bytes are in: the loop reads them and asks gRPC to take it
  pending_.emplace_back(a.accepted + options_.handshake_timeout, c->id);
  conns_[c->id] = std::move(c);
}

void PeerPort::Watch(Conn& c) {
  // Before the hand-over the client's first bytes stay buffered.
  epoll_event ce{};
  ce.events = c.splice.ClientEvents();
  ce.data.u64 = c.id << 1;
  (void)::epoll_ctl(epoll_.get(), c.client_watched ? EPOLL_CTL_MOD : EPOLL_CTL_ADD,
                    c.splice.client().get(), &ce);
  c.client_watched = true;
  const int inner = c.splice.inner().get();
  if (inner < 0) return;
  if (c.splice.inner_done()) {
    // A closed end reports hang-up for ever: stop watching it.
    if (c.inner_watched) (void)::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, inner, nullptr);
    c.inner_watched = false;
    return;
  }
  epoll_event ie{};
  ie.events = c.splice.InnerEvents();
  ie.data.u64 = (c.id << 1) | 1;
  (void)::epoll_ctl(epoll_.get(), c.inner_watched ? EPOLL_CTL_MOD : EPOLL_CTL_ADD, inner, &ie);
  c.inner_watched = true;
}

bool PeerPort::Pump(Conn& c) {
  return c.splice.Pump({.from_client =
                            [&c](const char* data, size_t n) {
                              if (!c.from_client.Feed(data, n)) {
                                c.closed_for = kNotTls;
                                return false;
                              }
                              if (c.from_client.application_data_completed() > 0)
                                c.client_sent_data = true;
                              return true;
                            },
                        .from_inner =
                            [&c](const char* data, size_t n) {
                              c.server_spoke = true;
                              const uint64_t seen = c.from_server.application_data_started();
                              (void)c.from_server.Feed(data, n);
                              if (c.client_sent_data &&
                                  c.from_server.application_data_started() > seen) {
                                c.established = true;
                              }
                            }});
}

void PeerPort::Close(uint64_t id, const char* reason) {
  auto it = conns_.find(id);
  if (it == conns_.end()) return;
  const Conn& c = *it->second;
  uint64_t n = 0;
  {
    MutexLock l(mu_);
    if (!c.name.empty()) sources_.erase(c.name);
    if (reason != nullptr) n = ++counters_.refused[reason];
  }
  // The first of a kind and every 1024th after: a flood does not flood the log.
  if (reason == nullptr && n == 0) {
    // Ended by a peer, or closed to make room (the acceptor counts and logs that).
  } else if (reason == kHandshake && n % 1024 == 1) {
    WC_LOG_WARN(
        "peer port: %s closed: no TLS handshake completed within %d ms "
        "(--peer_handshake_timeout_ms; %d so closed since start)",
        c.from.source, options_.handshake_timeout.count(), n);
  } else if (reason == kNotTls && n % 1024 == 1) {
    WC_LOG_WARN("peer port: %s closed: its bytes are not TLS (%d so closed since start)",
                c.from.source, n);
  }
  if (reason == kHandshake && c.splice.inner() && !c.server_spoke && silent_server_++ % 1024 == 0) {
    // A live gRPC answers a ClientHello within milliseconds, or closes.
    WC_LOG_ERROR(
        "peer port: %s: the peer API's gRPC server answered nothing in %d ms: is it still "
        "accepting? (gRPC 1.51 stops for good after one EMFILE)",
        c.from.source, options_.handshake_timeout.count());
  }
  conns_.erase(it);  // closes both sockets: gRPC sees its end close
}

void PeerPort::OutOfDescriptors(std::atomic<bool>& ok, const std::string& what, int err) {
  if (ok.exchange(false)) {
    WC_LOG_ERROR(
        "peer port: %s: %s; retrying every %d ms until descriptors are free (raise the "
        "open-file limit?)",
        what, std::strerror(err), kBackoffMs);
  }
}

bool PeerPort::MakeRoom() {
  // The oldest connection still in its handshake goes: a flood of connections that never
  // complete one cannot keep a real peer out for long.
  while (!pending_.empty()) {
    const uint64_t id = pending_.front().second;
    pending_.pop_front();
    auto it = conns_.find(id);
    if (it == conns_.end() || it->second->established) continue;
    Close(id, nullptr);  // counted by the acceptor, as "total"
    return true;
  }
  return false;
}

bool PeerPort::HandOver(Conn& c) {
  int err = 0;
  auto inner = ConnectNamed(options_.backend_path, &err);
  if (!inner.ok()) {
    if (net::IsOutOfDescriptors(err)) {
      OutOfDescriptors(handover_ok_, "socket for the relay", err);
    } else {  // EAGAIN: gRPC's backlog is full; ECONNREFUSED/ENOENT: it is gone
      WC_LOG_WARN("peer port: %s closed: the peer API's gRPC socket did not take it: %s",
                  c.from.source, std::string(inner.status().message()));
    }
    return false;
  }
  c.splice.SetInner(std::move(inner->fd));
  c.name = inner->name;
  MutexLock l(mu_);
  if (!c.name.empty()) sources_[c.name] = c.from.source;
  counters_.relayed++;
  return true;
}

size_t PeerPort::Unread() {
  unread_.erase(
      std::remove_if(
          unread_.begin(), unread_.end(),
          [this](uint64_t id) {
            auto u = conns_.find(id);
            if (u == conns_.end() || u->second->server_spoke || u->second->splice.inner_done()) {
              return true;
            }
            // Bytes gRPC has not read are still ours (unix(7) SIOCOUTQ).
            int outq = 0;
            return ::ioctl(u->second->splice.inner().get(), SIOCOUTQ, &outq) != 0 || outq == 0;
          }),
      unread_.end());
  return unread_.size();
}

Clock::time_point PeerPort::ServeWaiting() {
  while (!waiting_.empty()) {
    auto it = conns_.find(waiting_.front());
    if (it == conns_.end() || it->second->splice.inner()) {
      waiting_.pop_front();
      continue;
    }
    // One at a time: the last one handed over first accepted (and read) by gRPC.
    if (Unread() > 0) return Clock::now() + std::chrono::milliseconds(kUnreadRetryMs);
    if (const int err = net::DescriptorHeadroom(epoll_.get(), kHeadroom); err != 0) {
      OutOfDescriptors(
          handover_ok_,
          absl::StrCat("fewer than ", kHeadroom, " descriptors free to hand a connection to gRPC"),
          err);
      return Clock::now() + std::chrono::milliseconds(kBackoffMs);
    }
    waiting_.pop_front();
    Conn& c = *it->second;
    c.waiting = false;
    if (!HandOver(c)) {
      Close(c.id, kHandover);
      continue;
    }
    if (!Pump(c)) {  // its first bytes on to gRPC
      Close(c.id, c.closed_for);
      continue;
    }
    Watch(c);
    unread_.push_back(c.id);
    if (!handover_ok_.exchange(true)) WC_LOG_INFO("peer port: handing connections to gRPC again");
  }
  return Clock::time_point::max();
}

void PeerPort::Tick(Clock::time_point now) {
  if (stop_accepting_ && accepting_) {
    acceptor_->Stop();  // closes the sockets: new connections are refused by the kernel
    (void)::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, acceptor_->fd(), nullptr);
    accepting_ = false;
    MutexLock l(mu_);
    accepting_stopped_ = true;
    cv_.NotifyAll();
  }
  if (close_all_) {
    conns_.clear();
    pending_.clear();
    waiting_.clear();
    unread_.clear();
    MutexLock l(mu_);
    sources_.clear();
    connections_closed_ = true;
    cv_.NotifyAll();
  }
  // Connections past their handshake deadline (pending_ is in accept order, so in deadline
  // order too).
  while (!pending_.empty() && pending_.front().first <= now) {
    const uint64_t id = pending_.front().second;
    pending_.pop_front();
    auto it = conns_.find(id);
    if (it != conns_.end() && !it->second->established) Close(id, kHandshake);
  }
  if (now >= serve_waiting_at_) serve_waiting_at_ = ServeWaiting();
}

int PeerPort::TimeoutMs(Clock::time_point now) const {
  auto wake_at = serve_waiting_at_;
  if (!pending_.empty()) wake_at = std::min(wake_at, pending_.front().first);
  int ms = -1;
  if (wake_at != Clock::time_point::max()) {
    ms = static_cast<int>(
        std::max<int64_t>(1, std::chrono::ceil<std::chrono::milliseconds>(wake_at - now).count()));
  }
  const int door = accepting_ ? acceptor_->TimeoutMs() : -1;
  if (door >= 0 && (ms < 0 || door < ms)) ms = door;
  return ms;
}

void PeerPort::OnEvent(uint64_t data, uint32_t events) {
  if (data == kWakeId) {
    uint64_t v;
    (void)::read(wake_.get(), &v, sizeof v);
    return;
  }
  if (data == kAcceptorId) return;  // the loop runs the acceptor on every pass
  auto it = conns_.find(data >> 1);
  if (it == conns_.end()) return;  // closed earlier in this batch
  Conn& c = *it->second;
  if (events & (EPOLLHUP | EPOLLERR)) {
    if ((data & 1) == 0) {
      Close(c.id, nullptr);  // the client is gone
      return;
    }
    c.splice.InnerDone();
  }
  if (!Pump(c)) {
    Close(c.id, c.closed_for);
    return;
  }
  Watch(c);
  if (!c.splice.inner() && c.splice.client_pending() &&
      !c.waiting) {  // its first bytes: gRPC is asked to take it
    c.waiting = true;
    waiting_.push_back(c.id);
    // At once, unless the queue already waits for descriptors or for gRPC to read.
    if (serve_waiting_at_ == Clock::time_point::max()) serve_waiting_at_ = Clock::now();
  }
}

void PeerPort::Loop() {
  epoll_event events[64];
  EpollWaiter waiter("peer port");
  bool door_watched = true;
  while (!stop_) {
    const auto now = Clock::now();
    Tick(now);
    // A connection gRPC has not accepted yet needs a descriptor there: while one is unread,
    // nothing is accepted (the acceptor's readiness is not even watched: it would spin).
    const bool door_open = accepting_ && Unread() == 0;
    if (accepting_ && door_open != door_watched) {
      epoll_event ev{};
      ev.events = door_open ? static_cast<uint32_t>(EPOLLIN) : 0u;
      ev.data.u64 = kAcceptorId;
      (void)::epoll_ctl(epoll_.get(), EPOLL_CTL_MOD, acceptor_->fd(), &ev);
      door_watched = door_open;
    }
    int timeout = TimeoutMs(now);
    if (accepting_ && !door_open && (timeout < 0 || timeout > kUnreadRetryMs)) {
      timeout = kUnreadRetryMs;
    }
    const int n = waiter.Wait(epoll_.get(), events, 64, timeout);
    for (int i = 0; i < n && !stop_; ++i) OnEvent(events[i].data.u64, events[i].events);
    if (door_open && !stop_ && !stop_accepting_) acceptor_->Run();
  }
  conns_.clear();
  MutexLock l(mu_);
  sources_.clear();
  loop_ended_ = true;
  cv_.NotifyAll();
}

}  // namespace weightcache::server
