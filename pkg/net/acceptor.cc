#include "pkg/net/acceptor.h"

#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "pkg/net/descriptors.h"
#include "pkg/util/epoll_loop.h"
#include "pkg/util/errno_status.h"
#include "pkg/util/log.h"

namespace weightcache::net {
namespace {

using Clock = std::chrono::steady_clock;
constexpr uint64_t kWakeData = 0;
constexpr int kBackoffMs = 100;        // after EMFILE/ENFILE
constexpr int kAcceptsPerWakeup = 64;  // then the waiting connections get their turn

// How often the handed-over connections are looked at for idleness: a quarter of the idle
// timeout, within 10 ms and 1 s (a connection ends at most that late).
Clock::duration IdleScanPeriod(std::chrono::milliseconds idle) {
  return std::clamp<Clock::duration>(idle / 4, std::chrono::milliseconds(10),
                                     std::chrono::seconds(1));
}

}  // namespace

struct Acceptor::Waiting {
  Accepted conn;
  Clock::time_point deadline;
};

absl::StatusOr<std::unique_ptr<Acceptor>> Acceptor::Start(ListenerOptions options) {
  if (!options.serve) return absl::InvalidArgumentError("acceptor " + options.name + ": no serve");
  auto e = MakeEpollWithWake(kWakeData);
  if (!e.ok()) return e.status();
  return std::unique_ptr<Acceptor>(
      new Acceptor(std::move(options), std::move(e->epoll), std::move(e->wake)));
}

Acceptor::Acceptor(ListenerOptions options, ScopedFd epoll, ScopedFd wake)
    : options_(std::move(options)),
      limiter_(options_.limits),
      epoll_(std::move(epoll)),
      wake_(std::move(wake)),
      waiter_(options_.name + " acceptor") {
  if (options_.own_thread) thread_ = std::thread(&Acceptor::Loop, this);
}

Acceptor::~Acceptor() { Stop(); }

void Acceptor::Stop() {
  if (stop_.exchange(true)) return;
  uint64_t one = 1;
  (void)::write(wake_.get(), &one, sizeof one);
  if (thread_.joinable()) thread_.join();
  sockets_.clear();
  waiting_.clear();
  watched_.clear();
}

absl::Status Acceptor::Listen(ScopedFd listening, std::string tag) {
  const int flags = ::fcntl(listening.get(), F_GETFL);
  if (flags < 0 || ::fcntl(listening.get(), F_SETFL, flags | O_NONBLOCK) != 0) {
    return ErrnoStatus(errno, "fcntl O_NONBLOCK on the " + options_.name + " socket");
  }
  {
    MutexLock l(mu_);
    changes_.push_back({true, Socket{std::move(listening), std::move(tag), 0}});
  }
  uint64_t one = 1;
  (void)::write(wake_.get(), &one, sizeof one);
  return absl::OkStatus();
}

void Acceptor::Unlisten(const std::string& tag) {
  {
    MutexLock l(mu_);
    changes_.push_back({false, Socket{ScopedFd(), tag, 0}});
  }
  uint64_t one = 1;
  (void)::write(wake_.get(), &one, sizeof one);
}

Acceptor::Counters Acceptor::counters() const {
  MutexLock l(mu_);
  Counters c = counters_;
  c.open = limiter_.Total();
  return c;
}

void Acceptor::SyncSockets() {
  std::vector<SocketChange> changes;
  {
    MutexLock l(mu_);
    changes.swap(changes_);
  }
  for (SocketChange& c : changes) {
    if (!c.add) {
      for (auto it = sockets_.begin(); it != sockets_.end();) {
        // close: epoll forgets it
        it = it->second.tag == c.socket.tag ? sockets_.erase(it) : std::next(it);
      }
      continue;
    }
    Socket& s = c.socket;
    s.id = next_id_++;
    epoll_event ev{};
    ev.events = listening_on_ ? static_cast<uint32_t>(EPOLLIN) : 0u;
    ev.data.u64 = s.id << 1;
    if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, s.fd.get(), &ev) != 0) {
      WC_LOG_ERROR("%s: epoll_ctl on a listening socket: %s", options_.name, std::strerror(errno));
      continue;
    }
    sockets_.emplace(s.id, std::move(s));
  }
}

void Acceptor::SetListening(bool on) {
  if (listening_on_ == on) return;
  listening_on_ = on;
  for (auto& [id, s] : sockets_) {
    epoll_event ev{};
    ev.events =
        on ? static_cast<uint32_t>(EPOLLIN) : 0u;  // while backing off the sockets stay, unwatched
    ev.data.u64 = id << 1;
    (void)::epoll_ctl(epoll_.get(), EPOLL_CTL_MOD, s.fd.get(), &ev);
  }
}

bool Acceptor::DescriptorsFree() const {
  // The accepted connection's, and what the listener takes for it.
  return DescriptorHeadroom(wake_.get(), options_.fds_per_connection + 1) == 0;
}

int Acceptor::TimeoutMs() const {
  auto until = Clock::time_point::max();
  if (!listening_on_) until = backoff_until_;
  if (!waiting_.empty()) until = std::min(until, waiting_.begin()->second->deadline);
  if (!watched_.empty()) until = std::min(until, next_idle_scan_);
  if (until == Clock::time_point::max()) return -1;
  const auto ms = std::chrono::ceil<std::chrono::milliseconds>(until - Clock::now()).count();
  return static_cast<int>(std::clamp<int64_t>(ms, 0, INT_MAX));
}

void Acceptor::Loop() {
  while (!stop_) Step(TimeoutMs());
}

void Acceptor::Step(int timeout_ms) {
  if (stop_) return;
  SyncSockets();
  if (!listening_on_ && Clock::now() >= backoff_until_) {
    if (DescriptorsFree()) {
      SetListening(true);
      if (!healthy_.exchange(true)) WC_LOG_INFO("%s: accepting again", options_.name);
    } else {
      backoff_until_ = Clock::now() + std::chrono::milliseconds(kBackoffMs);
    }
  }
  epoll_event events[64];
  const int n = waiter_.Wait(epoll_.get(), events, 64, timeout_ms);
  for (int i = 0; i < n && !stop_; ++i) {
    const uint64_t data = events[i].data.u64;
    if (data == kWakeData) {
      uint64_t v;
      (void)::read(wake_.get(), &v, sizeof v);
      continue;
    }
    if ((data & 1) == 0) {
      auto s = sockets_.find(data >> 1);
      if (s == sockets_.end() || !listening_on_) continue;
      if (!AcceptFrom(s->second)) {
        SetListening(false);
        backoff_until_ = Clock::now() + std::chrono::milliseconds(kBackoffMs);
      }
      continue;
    }
    auto w = waiting_.find(data >> 1);
    if (w == waiting_.end()) continue;
    Accepted a = std::move(w->second->conn);
    waiting_.erase(w);
    (void)::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, a.fd.get(), nullptr);
    // Bytes came (or the peer hung up, which its reader sees as the end): the listener's.
    HandOver(std::move(a));
  }
  ExpireWaiting();
  ExpireIdle();
}

bool Acceptor::MakeRoom() {
  if (!options_.make_room) return false;
  if (!waiting_.empty()) {
    Accepted a = std::move(waiting_.begin()->second->conn);
    waiting_.erase(waiting_.begin());
    Refuse(a.fd.get(), "total",
           absl::StrCat(a.who.describe, " closed to make room: ", options_.name,
                        " is at its cap in all and it had sent nothing yet"));
    return true;
  }
  if (!options_.make_room()) return false;
  {
    MutexLock l(mu_);
    counters_.refused["total"]++;
  }
  if (options_.on_refused) options_.on_refused("total");
  return true;
}

bool Acceptor::AcceptFrom(const Socket& s) {
  for (int i = 0; i < kAcceptsPerWakeup && !stop_; ++i) {
    ScopedFd conn(::accept4(s.fd.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
    if (!conn) {
      const int err = errno;
      if (!IsOutOfDescriptors(err)) return true;  // EAGAIN: drained; ECONNABORTED and the like
      {
        MutexLock l(mu_);
        counters_.refused["descriptors"]++;
      }
      if (options_.on_refused) options_.on_refused("descriptors");
      if (healthy_.exchange(false)) {
        WC_LOG_ERROR(
            "%s: accept: %s; retrying every %d ms until descriptors are free (raise the "
            "open-file limit?)",
            options_.name, std::strerror(err), kBackoffMs);
      }
      return false;
    }
    Admit(std::move(conn), s.tag);
    if (!healthy_.load()) return false;  // serve ran out of descriptors
  }
  return true;
}

void Acceptor::Admit(ScopedFd conn, const std::string& tag) {
  Identity who;
  if (options_.identify) {
    auto id = options_.identify(conn.get(), tag);
    if (!id.ok()) {
      Refuse(conn.get(), "identity", std::string(id.status().message()));
      return;
    }
    who = std::move(id).value();
  }
  KeyedLimiter::Claim claim = limiter_.Take(who.key);
  if (claim.verdict == KeyedLimiter::Verdict::kRefusedTotal && MakeRoom()) {
    claim = limiter_.Take(who.key);
  }
  if (!claim.taken()) {
    const bool total = claim.verdict == KeyedLimiter::Verdict::kRefusedTotal;
    const auto& lim = limiter_.limits();
    Refuse(conn.get(), KeyedLimiter::VerdictName(claim.verdict),
           total ? absl::StrCat(options_.name, " holds ", claim.total_held,
                                " connections, its cap in all")
                 : absl::StrCat(who.describe, " holds ", claim.key_held, " ", options_.name,
                                " connections, its cap (", lim.per_key, lim.over_cap ? " and " : "",
                                lim.over_cap ? absl::StrCat(lim.over_cap, " answered refusals")
                                             : std::string(),
                                ")"));
    return;
  }
  Accepted a;
  a.fd = std::move(conn);
  a.who = std::move(who);
  a.tag = tag;
  a.over_cap = claim.verdict == KeyedLimiter::Verdict::kOverCap;
  a.slot = std::move(claim.slot);
  a.accepted = Clock::now();
  if (options_.first_byte.count() <= 0) {
    HandOver(std::move(a));
    return;
  }
  const uint64_t id = next_id_++;
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLRDHUP;
  ev.data.u64 = (id << 1) | 1;
  if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, a.fd.get(), &ev) != 0) {
    WC_LOG_WARN("%s: epoll_ctl on a connection: %s; closed", options_.name, std::strerror(errno));
    return;
  }
  auto w = std::make_unique<Waiting>();
  w->deadline = a.accepted + options_.first_byte;
  w->conn = std::move(a);
  waiting_.emplace(id, std::move(w));
  MutexLock l(mu_);
  counters_.waiting = waiting_.size();
}

void Acceptor::HandOver(Accepted a) {
  {
    MutexLock l(mu_);
    counters_.waiting = waiting_.size();
  }
  if (options_.idle.count() > 0) {
    auto activity = std::make_shared<Activity>(a.fd.get());
    if (watched_.empty()) next_idle_scan_ = Clock::now() + IdleScanPeriod(options_.idle);
    watched_.push_back(Watched{activity, a.who.describe});
    a.activity = ActivityHandle(std::move(activity));
  }
  if (options_.serve(std::move(a))) {
    MutexLock l(mu_);
    counters_.accepted++;
    return;
  }
  {
    MutexLock l(mu_);
    counters_.refused["descriptors"]++;
  }
  if (options_.on_refused) options_.on_refused("descriptors");
  if (healthy_.exchange(false)) {
    WC_LOG_ERROR("%s: out of descriptors for a connection; retrying every %d ms", options_.name,
                 kBackoffMs);
  }
  SetListening(false);
  backoff_until_ = Clock::now() + std::chrono::milliseconds(kBackoffMs);
}

void Acceptor::ExpireWaiting() {
  // Waiting connections share one deadline after their accept: in id order, oldest first.
  const auto now = Clock::now();
  while (!waiting_.empty() && waiting_.begin()->second->deadline <= now) {
    Accepted a = std::move(waiting_.begin()->second->conn);
    waiting_.erase(waiting_.begin());
    {
      // Counted before the client sees its end (a test, or a scrape, reads it then).
      MutexLock l(mu_);
      counters_.waiting = waiting_.size();
    }
    Refuse(a.fd.get(), "first_byte",
           absl::StrCat(a.who.describe, " sent nothing within ", options_.first_byte.count(),
                        " ms of connecting"));
  }
  MutexLock l(mu_);
  counters_.waiting = waiting_.size();
}

void Acceptor::ExpireIdle() {
  if (watched_.empty()) return;
  const auto now = Clock::now();
  if (now < next_idle_scan_) return;
  next_idle_scan_ = now + IdleScanPeriod(options_.idle);
  size_t kept = 0;
  for (size_t i = 0; i < watched_.size(); ++i) {
    Watched& w = watched_[i];
    if (w.activity->ShutDownIfIdle(now, options_.idle)) {
      uint64_t nth = 0;
      {
        MutexLock l(mu_);
        nth = counters_.refused["idle"]++;
      }
      if (nth % 1024 == 0) {
        WC_LOG_INFO("%s: ended a connection of %s: no byte moved for %d ms", options_.name,
                    w.describe, options_.idle.count());
      }
      if (options_.on_refused) options_.on_refused("idle");
      continue;
    }
    if (w.activity->closed()) continue;
    if (kept != i) watched_[kept] = std::move(w);
    ++kept;
  }
  watched_.resize(kept);
}

void Acceptor::Refuse(int fd, const std::string& reason, const std::string& message) {
  uint64_t nth = 0;
  {
    MutexLock l(mu_);
    nth = counters_.refused[reason]++;
  }
  // A burst is logged once per 1024: an attack must not fill the log.
  if (nth % 1024 == 0) {
    WC_LOG_WARN("%s: refused a connection (%s): %s", options_.name, reason, message);
  }
  if (options_.tell_refused) options_.tell_refused(fd, reason, message);
  if (options_.on_refused) options_.on_refused(reason);
}

}  // namespace weightcache::net
