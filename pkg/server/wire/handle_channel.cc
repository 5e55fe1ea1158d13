#include "pkg/server/wire/handle_channel.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>

#include "absl/strings/str_cat.h"
#include "pkg/server/wire/handle_message.h"
#include "pkg/util/errno_status.h"
#include "pkg/util/log.h"

namespace weightcache::server {
namespace {

constexpr size_t kMaxLine = kMaxHandshakeLine;
constexpr int kTickMs = 200;
constexpr int kSendTimeoutSeconds = 2;  // one descriptor batch to a peer that does not read

void SendError(int fd, const std::string& msg) { (void)WriteAll(fd, FormatErrorLine(msg)); }

// Sends a lease's descriptors on `fd` in batches. Blocking sends: they are tiny, but a peer
// that never reads could still stop the loop's one thread once its socket buffer is full
// (issue 26), so each send is bounded: past kSendTimeoutSeconds the connection ends.
absl::Status SendDescriptors(int fd, const std::vector<int>& fds) {
  int flags = ::fcntl(fd, F_GETFL);
  ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  const timeval send_timeout{kSendTimeoutSeconds, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &send_timeout, sizeof send_timeout);
  absl::Status sent = absl::OkStatus();
  for (size_t at = 0; at < fds.size() && sent.ok(); at += kMaxFdsPerMessage) {
    size_t k = std::min(kMaxFdsPerMessage, fds.size() - at);
    std::vector<int> batch(fds.begin() + at, fds.begin() + at + k);
    sent = SendWithFds(fd, absl::StrCat("FDS ", k, "\n"), batch);
  }
  ::fcntl(fd, F_SETFL, flags);
  return sent;
}

}  // namespace

struct HandleChannel::Conn {
  ScopedFd fd;
  std::string buf;
  std::string lease_id;  // empty until the token is claimed
  std::chrono::steady_clock::time_point accepted = std::chrono::steady_clock::now();
  std::string slot;               // of the socket it came in on; empty: the shared one
  net::KeyedLimiter::Slot place;  // in the acceptor's caps, until the connection ends
};

absl::StatusOr<std::unique_ptr<HandleChannel>> HandleChannel::Start(const Options& options,
                                                                    ClaimFn claim, CloseFn close,
                                                                    TickFn tick) {
  std::vector<std::pair<ScopedFd, std::string>> listening;  // the socket and its slot
  auto listen = [&](const std::string& path, const std::string& slot) -> absl::Status {
    auto fd = ListenUnix(path, options.mode);
    if (!fd.ok()) return fd.status();
    listening.emplace_back(std::move(fd).value(), slot);
    return absl::OkStatus();
  };
  if (auto s = listen(options.path, ""); !s.ok()) return s;
  for (const auto& slot : options.slot_sockets) {
    if (auto s = listen(slot.path, slot.slot); !s.ok()) return s;
  }
  ScopedFd wake(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wake) return ErrnoStatus(errno, "eventfd");
  auto ch = std::unique_ptr<HandleChannel>(new HandleChannel(
      options, std::move(wake), std::move(claim), std::move(close), std::move(tick)));
  net::ListenerOptions a;
  a.name = "handle";
  a.limits = {.total = options.max_connections,
              .per_key = options.max_connections_per_pod,
              .over_cap = 0,
              .own_caps = {{tenant::kUnresolvedKey, options.max_connections_unresolved}}};
  a.first_byte = options.handshake_timeout;  // a client sends its token at once
  a.identify = [raw = ch.get()](int fd, const std::string& slot) {
    return raw->Identify(fd, slot);
  };
  a.serve = [raw = ch.get()](net::Accepted c) {
    {
      MutexLock l(raw->mu_);
      raw->incoming_.push_back(std::move(c));
    }
    uint64_t one = 1;
    (void)::write(raw->wake_.get(), &one, sizeof one);
    return true;
  };
  a.tell_refused = [](int fd, const std::string& reason, const std::string& message) {
    SendError(fd, reason == "first_byte"
                      ? "DEADLINE_EXCEEDED: handshake timed out"
                      : absl::StrCat(
                            reason == "identity" ? "PERMISSION_DENIED: " : "RESOURCE_EXHAUSTED: ",
                            message));
  };
  a.on_refused = options.on_refused;
  auto acceptor = net::Acceptor::Start(std::move(a));
  if (!acceptor.ok()) return acceptor.status();
  ch->acceptor_ = std::move(acceptor).value();
  for (auto& [fd, slot] : listening) {
    if (auto s = ch->acceptor_->Listen(std::move(fd), slot); !s.ok()) return s;
  }
  return ch;
}

HandleChannel::HandleChannel(Options options, ScopedFd wake, ClaimFn claim, CloseFn close,
                             TickFn tick)
    : options_(std::move(options)),
      resolver_(options_.proc_root),
      wake_(std::move(wake)),
      claim_(std::move(claim)),
      close_(std::move(close)),
      tick_(std::move(tick)) {
  thread_ = std::thread(&HandleChannel::Loop, this);
}

absl::StatusOr<net::Identity> HandleChannel::Identify(int fd, const std::string& slot) const {
  auto cred = GetPeerCred(fd);
  const pid_t pid = cred.ok() ? cred->pid : 0;
  tenant::Unit unit;
  if (PodSocketBook::IsPodTag(slot)) {
    std::optional<tenant::Unit> pod = pods_.UnitOf(slot, pid);
    if (!pod) return absl::UnavailableError("the pod's socket was removed");
    unit = std::move(*pod);
  } else {
    unit = slot.empty() ? resolver_.Resolve(pid, fd) : tenant::Unit::OfSlot(slot, pid);
  }
  return net::Identity{unit.Key(), unit.Describe(), {}};
}

absl::Status HandleChannel::AddPodSocket(const std::string& path, const tenant::Unit& pod) {
  return pods_.Add(*acceptor_, path, pod, 128);
}

void HandleChannel::RemovePodSocket(const std::string& uid) { pods_.Remove(*acceptor_, uid); }

HandleChannel::~HandleChannel() {
  if (acceptor_ != nullptr) acceptor_->Stop();
  {
    MutexLock l(mu_);
    stop_ = true;
  }
  uint64_t one = 1;
  (void)::write(wake_.get(), &one, sizeof one);
  thread_.join();
  ::unlink(options_.path.c_str());
  for (const auto& s : options_.slot_sockets) ::unlink(s.path.c_str());
  pods_.UnlinkAll();
}

void HandleChannel::CloseLease(const std::string& lease_id) {
  {
    MutexLock l(mu_);
    to_close_.insert(lease_id);
  }
  uint64_t one = 1;
  (void)::write(wake_.get(), &one, sizeof one);
}

void HandleChannel::Notify(const std::string& lease_id, std::string line) {
  {
    MutexLock l(mu_);
    to_notify_.emplace(lease_id, std::move(line));
  }
  uint64_t one = 1;
  (void)::write(wake_.get(), &one, sizeof one);
}

void HandleChannel::Loop() {
  Conns conns;
  auto last_tick = std::chrono::steady_clock::now();
  while (true) {
    std::set<std::string> closing;
    std::multimap<std::string, std::string> notifying;
    {
      MutexLock l(mu_);
      if (stop_) break;
      closing.swap(to_close_);
      notifying.swap(to_notify_);
    }
    TakeIncoming(conns);
    SendEvents(conns, notifying);
    CloseLeases(conns, closing);
    std::vector<pollfd> fds;
    fds.push_back({wake_.get(), POLLIN, 0});
    const size_t first_conn = fds.size();
    for (const auto& [fd, c] : conns) fds.push_back({fd, POLLIN, 0});
    int n = ::poll(fds.data(), fds.size(), kTickMs);
    if (n < 0 && errno != EINTR) {
      WC_LOG_ERROR("handle channel: poll: %s", std::string(::strerror(errno)));
      break;
    }
    auto now = std::chrono::steady_clock::now();
    if (now - last_tick >= std::chrono::milliseconds(kTickMs)) {
      last_tick = now;
      if (tick_) tick_();
    }
    EndStaleHandshakes(conns, now);
    if (n <= 0) continue;
    if (fds[0].revents & POLLIN) {
      uint64_t v;
      (void)::read(wake_.get(), &v, sizeof v);
    }
    for (size_t i = first_conn; i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      auto it = conns.find(fds[i].fd);
      if (it != conns.end()) Read(conns, it);
    }
  }
  while (!conns.empty()) EndConn(conns, conns.begin());
}

// Closes a connection; its lease, if it has one, ends with it.
void HandleChannel::EndConn(Conns& conns, Conns::iterator it) {
  std::string lease = it->second.lease_id;
  conns.erase(it);  // closes the descriptor
  if (!lease.empty()) close_(lease);
}

// Sends the pending event lines to the connections of their leases.
void HandleChannel::SendEvents(const Conns& conns,
                               const std::multimap<std::string, std::string>& notifying) {
  for (const auto& [fd, c] : conns) {
    if (c.lease_id.empty()) continue;
    auto [first, last] = notifying.equal_range(c.lease_id);
    for (auto n = first; n != last; ++n) {
      // A line of a few hundred bytes into a socket the client does not read from: only a
      // full buffer (a client that ignored earlier events) drops it, never a wait here.
      if (::send(fd, n->second.data(), n->second.size(), MSG_DONTWAIT | MSG_NOSIGNAL) < 0) {
        WC_LOG_WARN("handle channel: event for lease %s not sent: %s", c.lease_id,
                    std::string(::strerror(errno)));
      }
    }
  }
}

// Ends the connections of the leases the daemon released (CloseLease).
void HandleChannel::CloseLeases(Conns& conns, const std::set<std::string>& closing) {
  for (auto it = conns.begin(); it != conns.end();) {
    if (!it->second.lease_id.empty() && closing.count(it->second.lease_id)) {
      auto next = std::next(it);
      EndConn(conns, it);
      it = next;
    } else {
      ++it;
    }
  }
}

// Connections that never completed the handshake: closed on every pass, also while the
// channel is otherwise idle.
void HandleChannel::EndStaleHandshakes(Conns& conns, std::chrono::steady_clock::time_point now) {
  for (auto it = conns.begin(); it != conns.end();) {
    auto next = std::next(it);
    if (it->second.lease_id.empty() && now - it->second.accepted > options_.handshake_timeout) {
      SendError(it->second.fd.get(), "DEADLINE_EXCEEDED: handshake timed out");
      EndConn(conns, it);
    }
    it = next;
  }
}

// Takes the connections the acceptor admitted (within the caps, their first bytes come).
void HandleChannel::TakeIncoming(Conns& conns) {
  std::vector<net::Accepted> incoming;
  {
    MutexLock l(mu_);
    incoming.swap(incoming_);
  }
  for (net::Accepted& a : incoming) {
    Conn c;
    c.slot = a.tag;
    c.accepted = a.accepted;
    c.place = std::move(a.slot);
    const int fd = a.fd.get();
    c.fd = std::move(a.fd);
    conns.emplace(fd, std::move(c));
  }
}

// Reads what a connection sent; decides when its handshake line is complete and well formed.
// EOF or an error ends the connection, and its lease if it has one.
void HandleChannel::Read(Conns& conns, Conns::iterator it) {
  Conn& c = it->second;
  char buf[kMaxLine];
  ssize_t r = ::read(c.fd.get(), buf, sizeof buf);
  if (r < 0 && (errno == EAGAIN || errno == EINTR)) return;
  if (r <= 0) {
    EndConn(conns, it);
    return;
  }
  if (!c.lease_id.empty()) return;  // a leased client has nothing to say; ignore
  c.buf.append(buf, r);
  const Handshake handshake = ParseHandshake(c.buf);
  if (handshake.state == Handshake::State::kIncomplete) return;
  if (handshake.state == Handshake::State::kError) {
    SendError(c.fd.get(), "INVALID_ARGUMENT: " + handshake.error);
    EndConn(conns, it);
    return;
  }
  Claim(conns, it, handshake.token);
}

// Decides whether the peer may have the lease of `token` (the uid allowlist, then ClaimFn)
// and sends it the lease's descriptors; a refusal is answered and the connection closed.
void HandleChannel::Claim(Conns& conns, Conns::iterator it, const std::string& token) {
  Conn& c = it->second;
  auto peer = GetPeerCred(c.fd.get());
  if (!peer.ok()) {
    SendError(c.fd.get(), std::string(peer.status().message()));
    EndConn(conns, it);
    return;
  }
  if (!options_.allowed_uids.empty() &&
      std::find(options_.allowed_uids.begin(), options_.allowed_uids.end(), peer->uid) ==
          options_.allowed_uids.end()) {
    WC_LOG_WARN("handle channel: refused uid %d (pid %d): not in the allowlist",
                static_cast<int>(peer->uid), static_cast<int>(peer->pid));
    SendError(c.fd.get(), absl::StrCat("PERMISSION_DENIED: uid ", peer->uid,
                                       " is not allowed (--allowed_uids)"));
    EndConn(conns, it);
    return;
  }
  auto grant = claim_(token, *peer, c.slot);
  if (!grant.ok()) {
    // The code first, so the client can tell a refusal from an ended lease.
    SendError(c.fd.get(), absl::StrCat(absl::StatusCodeToString(grant.status().code()), ": ",
                                       grant.status().message()));
    EndConn(conns, it);
    return;
  }
  const absl::Status sent = SendDescriptors(c.fd.get(), grant->fds);
  c.lease_id = grant->lease_id;
  if (!sent.ok()) {
    WC_LOG_WARN("handle channel: sending descriptors to pid %d failed: %s",
                static_cast<int>(peer->pid), std::string(sent.message()));
    EndConn(conns, it);
  }
}

}  // namespace weightcache::server
