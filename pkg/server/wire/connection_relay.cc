#include "pkg/server/wire/connection_relay.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <thread>

#include "pkg/net/splice.h"
#include "pkg/server/wire/http2_streams.h"
#include "pkg/util/epoll_loop.h"
#include "pkg/util/errno_status.h"
#include "pkg/util/log.h"

namespace weightcache::server {
namespace {

constexpr size_t kBufferBytes = 64 << 10;
constexpr uint64_t kWakeId = 0;

}  // namespace

struct ConnectionRelay::Conn {
  uint64_t id = 0;
  std::string label;
  // The client's socket and our end of the socket pair (gRPC holds the other); its inner
  // side done: gRPC closed its end (flush to the client, then close).
  net::Splice splice{ScopedFd(), kBufferBytes, /*lazy_buffers=*/false};
  net::KeyedLimiter::Slot slot;  // the connection's place in the listener's caps
  Http2StreamTracker streams;
  bool inner_watched = false;
  const char* closed_for = nullptr;  // the limit the client broke
  // Resets the client may still send now (a token bucket, refilled per second).
  double reset_tokens = 0;
  uint64_t resets_counted = 0;
  std::chrono::steady_clock::time_point refilled = std::chrono::steady_clock::now();
};

namespace {
constexpr char kOverStreams[] = "streams";
constexpr char kOverHeaderBlock[] = "header_block";
constexpr char kOverResets[] = "resets";
}  // namespace

absl::StatusOr<std::unique_ptr<ConnectionRelay>> ConnectionRelay::Start(Options options) {
  auto e = MakeEpollWithWake(kWakeId);
  if (!e.ok()) return e.status();
  return std::unique_ptr<ConnectionRelay>(
      new ConnectionRelay(std::move(options), std::move(e->epoll), std::move(e->wake)));
}

ConnectionRelay::ConnectionRelay(Options options, ScopedFd epoll, ScopedFd wake)
    : options_(std::move(options)), epoll_(std::move(epoll)), wake_(std::move(wake)) {
  thread_ = std::thread(&ConnectionRelay::Loop, this);
}

ConnectionRelay::~ConnectionRelay() {
  stop_ = true;
  uint64_t one = 1;
  (void)::write(wake_.get(), &one, sizeof one);
  thread_.join();
}

absl::StatusOr<int> ConnectionRelay::Add(ScopedFd client, net::KeyedLimiter::Slot slot,
                                         std::string label, net::ActivityHandle activity) {
  int pair[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, pair) != 0) {
    activity.Reset();  // before `client` closes
    return ErrnoStatus(errno, "socketpair for the control connection of " + label);
  }
  auto c = std::make_unique<Conn>();
  c->label = std::move(label);
  // Buffers kept while the connection lives: a control connection is busy when it is used.
  c->splice = net::Splice(std::move(client), kBufferBytes, /*lazy_buffers=*/false);
  c->splice.SetInner(ScopedFd(pair[0]));
  c->splice.SetActivity(std::move(activity));
  c->slot = std::move(slot);
  c->reset_tokens = options_.reset_burst;
  {
    MutexLock l(mu_);
    incoming_.push_back(std::move(c));
    counters_.relayed++;
  }
  uint64_t one = 1;
  (void)::write(wake_.get(), &one, sizeof one);
  return pair[1];
}

ConnectionRelay::Counters ConnectionRelay::counters() const {
  MutexLock l(mu_);
  return counters_;
}

void ConnectionRelay::Watch(Conn& c, bool add) {
  epoll_event ce{};
  ce.events = c.splice.ClientEvents();
  ce.data.u64 = c.id << 1;
  epoll_event ie{};
  ie.events = c.splice.InnerEvents();
  ie.data.u64 = (c.id << 1) | 1;
  const int op = add ? EPOLL_CTL_ADD : EPOLL_CTL_MOD;
  (void)::epoll_ctl(epoll_.get(), op, c.splice.client().get(), &ce);
  const int inner = c.splice.inner().get();
  if (add) {
    (void)::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, inner, &ie);
    c.inner_watched = true;
  } else if (c.splice.inner_done() && c.inner_watched) {
    // A closed end reports hang-up for ever: stop watching it.
    (void)::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, inner, nullptr);
    c.inner_watched = false;
  } else if (c.inner_watched) {
    (void)::epoll_ctl(epoll_.get(), EPOLL_CTL_MOD, inner, &ie);
  }
}

bool ConnectionRelay::Pump(Conn& c) {
  const bool go_on = c.splice.Pump(
      {.from_client =
           [&](const char* data, size_t n) {
             c.streams.FromClient(data, n);
             c.closed_for = OverLimit(c);
             return c.closed_for == nullptr;
           },
       .from_inner = [&](const char* data, size_t n) { c.streams.FromServer(data, n); }});
  // A call in flight (a long one, a watch) is work, however quiet its bytes.
  c.splice.activity().SetBusy(c.streams.open() > 0);
  return go_on;
}

const char* ConnectionRelay::OverLimit(Conn& c) const {
  if (c.streams.open() > options_.max_streams) return kOverStreams;
  if (c.streams.header_block_bytes() > options_.max_header_block) return kOverHeaderBlock;
  const uint64_t resets = c.streams.client_resets();
  if (resets != c.resets_counted) {
    const auto now = std::chrono::steady_clock::now();
    const double secs = std::chrono::duration<double>(now - c.refilled).count();
    c.reset_tokens =
        std::min(options_.reset_burst, c.reset_tokens + secs * options_.resets_per_second);
    c.refilled = now;
    c.reset_tokens -= static_cast<double>(resets - c.resets_counted);
    c.resets_counted = resets;
    if (c.reset_tokens < 0) return kOverResets;
  }
  return nullptr;
}

void ConnectionRelay::Loop() {
  std::map<uint64_t, std::unique_ptr<Conn>> conns;
  uint64_t next_id = 1;
  epoll_event events[64];
  EpollWaiter waiter("control relay");
  while (!stop_) {
    const int n = waiter.Wait(epoll_.get(), events, 64, -1);
    for (int i = 0; i < n; ++i) {
      if (events[i].data.u64 == kWakeId) {
        uint64_t v;
        (void)::read(wake_.get(), &v, sizeof v);
        std::vector<std::unique_ptr<Conn>> added;
        {
          MutexLock l(mu_);
          added.swap(incoming_);
        }
        for (auto& c : added) {
          c->id = next_id++;
          Watch(*c, /*add=*/true);
          conns[c->id] = std::move(c);
        }
        continue;
      }
      auto it = conns.find(events[i].data.u64 >> 1);
      if (it == conns.end()) continue;  // closed earlier in this batch
      Conn& c = *it->second;
      const bool inner = (events[i].data.u64 & 1) != 0;
      if (events[i].events & (EPOLLHUP | EPOLLERR)) {
        if (!inner) {
          conns.erase(it);  // the client is gone: nothing left to deliver to it
          continue;
        }
        c.splice.InnerDone();
      }
      if (Pump(c)) {
        Watch(c, /*add=*/false);
        continue;
      }
      if (c.closed_for == kOverStreams) {
        WC_LOG_WARN(
            "control connection of %s: more than %d HTTP/2 streams open at once; closed "
            "(a gRPC client keeps within the server's 16)",
            c.label, options_.max_streams);
        MutexLock l(mu_);
        counters_.closed_over_streams++;
      } else if (c.closed_for == kOverHeaderBlock) {
        WC_LOG_WARN(
            "control connection of %s: an HTTP/2 header block longer than %d bytes "
            "(HEADERS and CONTINUATION frames); closed",
            c.label, options_.max_header_block);
        MutexLock l(mu_);
        counters_.closed_over_header_block++;
      } else if (c.closed_for == kOverResets) {
        WC_LOG_WARN(
            "control connection of %s: %d streams reset, faster than %.0f at once and %.0f a "
            "second; closed (rapid reset)",
            c.label, c.streams.client_resets(), options_.reset_burst, options_.resets_per_second);
        MutexLock l(mu_);
        counters_.closed_over_resets++;
      }
      if (c.closed_for != nullptr && options_.on_closed) options_.on_closed(c.closed_for);
      conns.erase(it);  // closes both descriptors: gRPC sees its end close
    }
  }
}

}  // namespace weightcache::server
