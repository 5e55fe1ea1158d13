#include "pkg/keeper/server.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "pkg/util/errno_status.h"
#include "pkg/util/log.h"
#include "pkg/util/rlimit.h"
#include "pkg/util/status_macros.h"
#include "pkg/util/unix_socket.h"

namespace weightcache::keeper {

absl::StatusOr<std::unique_ptr<Keeper>> Keeper::Start(KeeperOptions options) {
  if (options.allowed_uids.empty()) options.allowed_uids.push_back(::geteuid());
  if (options.max_fds == 0) {
    const uint64_t limit = RaiseOpenFileLimit();
    if (limit <= 2 * kReservedFds) {
      return absl::FailedPreconditionError(
          absl::StrCat("keeper: the open-file limit is ", limit, " (hard); it needs more than ",
                       2 * kReservedFds, " to hold anything (raise ulimit -n / LimitNOFILE)"));
    }
    options.max_fds = limit - kReservedFds;
  }
  const std::string& path = options.socket_path;
  // Errors name the flag (the keeper's only path). A directory it finds is used as it is
  // (never chmod'ed: it may be /tmp); a file at the path is removed only when it is a
  // stale socket (unix_socket.h).
  const std::string label = "--socket=" + path;
  const auto slash = path.rfind('/');
  if (slash != std::string::npos && slash > 0) {
    WC_RETURN_IF_ERROR(Annotate(PrepareSocketDir(path.substr(0, slash), 0700), label));
  }
  WC_RETURN_IF_ERROR(
      RemoveStaleSocket(path, {.type = SOCK_SEQPACKET, .label = label, .server = "keeper"}));
  WC_ASSIGN_OR_RETURN(ScopedFd listener, ListenUnix(path, 0600, 16, SOCK_SEQPACKET));
  auto k = std::unique_ptr<Keeper>(new Keeper(std::move(options)));
  net::ListenerOptions a;
  a.name = "keeper";
  // One daemon owns the keeper at a time; a few more connections answer who does.
  a.limits = {
      .total = k->options_.max_connections, .per_key = k->options_.max_connections, .over_cap = 0};
  a.identify = [raw = k.get()](int fd, const std::string&) { return raw->Identify(fd); };
  a.serve = [raw = k.get()](net::Accepted c) {
    raw->Admit(std::move(c));
    return true;
  };
  a.tell_refused = [](int fd, const std::string& reason, const std::string& message) {
    (void)SendMessage(fd,
                      ErrorMessage(reason == "identity" ? absl::PermissionDeniedError(message)
                                                        : absl::ResourceExhaustedError(message)));
  };
  WC_ASSIGN_OR_RETURN(k->acceptor_, net::Acceptor::Start(std::move(a)));
  WC_RETURN_IF_ERROR(k->acceptor_->Listen(std::move(listener), ""));
  WC_LOG_INFO("keeper: serving on %s (peers: uid %s; up to %d descriptors)", k->path(),
              absl::StrJoin(k->options_.allowed_uids, ","),
              static_cast<long long>(k->options_.max_fds));
  return k;
}

Keeper::Keeper(KeeperOptions options) : options_(std::move(options)) {}

absl::StatusOr<net::Identity> Keeper::Identify(int fd) const {
  WC_ASSIGN_OR_RETURN(PeerCred cred, GetPeerCred(fd));
  const auto& ok = options_.allowed_uids;
  if (std::find(ok.begin(), ok.end(), cred.uid) == ok.end()) {
    return absl::PermissionDeniedError(absl::StrCat("uid ", cred.uid,
                                                    " may not use the keeper (allowed: uid ",
                                                    absl::StrJoin(ok, ","), ", the daemon's)"));
  }
  return net::Identity{absl::StrCat("uid:", cred.uid), absl::StrCat("uid ", cred.uid), {}};
}

Keeper::~Keeper() { Stop(); }

void Keeper::Stop() {
  std::map<int, std::thread> conns;
  if (acceptor_ != nullptr) acceptor_->Stop();  // nothing is admitted from here
  {
    MutexLock l(mu_);
    if (stopping_) return;
    stopping_ = true;
    // Unblocks each connection's recv; its thread then closes the socket.
    for (auto& [fd, t] : connections_) {
      if (std::find(finished_.begin(), finished_.end(), fd) == finished_.end()) {
        ::shutdown(fd, SHUT_RDWR);
      }
    }
  }
  {
    MutexLock l(mu_);
    conns.swap(connections_);
  }
  for (auto& [fd, t] : conns) t.join();
  ::unlink(options_.socket_path.c_str());
}

Keeper::Stats Keeper::stats() const {
  MutexLock l(mu_);
  Stats s;
  s.entries = entries_.size();
  for (const auto& [k, h] : entries_) s.fds += h->fds.size();
  s.max_fds = options_.max_fds;
  return s;
}

void Keeper::Admit(net::Accepted c) {
  // Threads of connections that ended are joined on every path: a std::thread destroyed
  // joinable ends the keeper (and with it every entry it holds).
  std::vector<std::thread> done;
  {
    MutexLock l(mu_);
    for (int fd : finished_) {
      auto it = connections_.find(fd);
      if (it == connections_.end()) continue;
      done.push_back(std::move(it->second));
      connections_.erase(it);
    }
    finished_.clear();
    // The connection's thread serves it with blocking calls (the acceptor's are not).
    const int flags = ::fcntl(c.fd.get(), F_GETFL);
    if (flags >= 0) (void)::fcntl(c.fd.get(), F_SETFL, flags & ~O_NONBLOCK);
    if (!stopping_) {
      // The greeting: a connecting client learns at once whether it is served. A peer that
      // gave up waiting (its connection queued while the keeper was stopped) is closed here.
      Message hello = MessageOf(Op::kOk);
      hello.body = kGreeting;
      if (SendMessage(c.fd.get(), hello).ok()) {
        const int fd = c.fd.release();
        // The connection's place in the caps goes with its thread.
        connections_.emplace(fd, std::thread([this, fd, place = std::move(c.slot)]() mutable {
                               Serve(fd);
                               place.Reset();
                             }));
      }
    }
  }
  for (auto& t : done) t.join();
}

void Keeper::Serve(int fd) {
  WC_LOG_INFO("keeper: peer connected");
  while (true) {
    auto m = RecvMessage(fd);
    absl::Status s = m.ok() ? Handle(fd, std::move(m).value()) : m.status();
    if (!s.ok()) {
      if (s.code() != absl::StatusCode::kUnavailable) {
        WC_LOG_WARN("keeper: connection closed: %s", std::string(s.message()));
      }
      break;
    }
  }
  WC_LOG_INFO("keeper: peer disconnected");
  MutexLock l(mu_);  // closed under the lock: Stop() shuts down live ones
  if (owner_fd_ == fd) {
    WC_LOG_INFO("keeper: the daemon pid %d let go; the next one to connect owns it",
                static_cast<int>(owner_pid_));
    owner_fd_ = -1;
    owner_pid_ = 0;
  }
  ::close(fd);
  finished_.push_back(fd);
}

absl::Status Keeper::Claim(int fd) {
  auto cred = GetPeerCred(fd);
  const pid_t pid = cred.ok() ? cred->pid : 0;
  MutexLock l(mu_);
  if (owner_fd_ == fd) return absl::OkStatus();
  if (owner_fd_ >= 0) {
    // An owner that hung up (killed) lets go now, not when its thread next runs: a daemon
    // restarted at once must not be refused by its own predecessor.
    pollfd p{owner_fd_, POLLRDHUP, 0};
    if (::poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0) {
      owner_fd_ = -1;
    }
  }
  if (owner_fd_ < 0) {
    owner_fd_ = fd;
    owner_pid_ = pid;
    WC_LOG_INFO("keeper: owned by the daemon pid %d", static_cast<int>(pid));
    return absl::OkStatus();
  }
  WC_LOG_WARN("keeper: refused pid %d: it serves the daemon pid %d", static_cast<int>(pid),
              static_cast<int>(owner_pid_));
  return absl::FailedPreconditionError(absl::StrCat(
      "it serves the daemon pid ", owner_pid_,
      ", one daemon at a time (stop that one, or give this one its own --keeper_socket)"));
}

absl::Status Keeper::Handle(int fd, Message m) {
  if (m.op == Op::kDeposit || m.op == Op::kDrop || m.op == Op::kAdopt) {
    if (absl::Status owner = Claim(fd); !owner.ok()) return SendMessage(fd, ErrorMessage(owner));
  }
  switch (m.op) {
    case Op::kDeposit:
      return Deposit(fd, std::move(m));
    case Op::kDrop: {
      std::shared_ptr<const Held> gone;  // closed outside the lock
      {
        MutexLock l(mu_);
        auto it = entries_.find(m.key);
        if (it != entries_.end()) {
          gone = std::move(it->second);
          fds_ -= gone->fds.size();
          entries_.erase(it);
        }
      }
      if (!gone) {
        return SendMessage(fd, ErrorMessage(absl::NotFoundError(
                                   absl::StrCat("drop: no entry '", m.key, "' is held"))));
      }
      WC_LOG_INFO("keeper: dropped %s (%d descriptors)", m.key, gone->fds.size());
      return SendMessage(fd, MessageOf(Op::kOk));
    }
    case Op::kAdopt:
      return Adopt(fd);
    case Op::kStats: {
      const Stats s = stats();
      Message r = MessageOf(Op::kOk);
      r.body = absl::StrCat("entries=", s.entries, " fds=", s.fds, " max_fds=", s.max_fds);
      return SendMessage(fd, r);
    }
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("keeper: a peer sent ", OpName(m.op), ", which is not a request"));
  }
}

absl::Status Keeper::Deposit(int fd, Message m) {
  if (m.key.empty() || m.nfds == 0) {
    return SendMessage(fd, ErrorMessage(absl::InvalidArgumentError(absl::StrCat(
                               "deposit '", m.key, "': needs a key and at least one descriptor"))));
  }
  {
    MutexLock l(mu_);
    if (fds_ + m.nfds > options_.max_fds) {
      const std::string why = absl::StrCat(
          "deposit '", m.key, "': ", m.nfds, " descriptors would pass the keeper's limit (holds ",
          fds_, " of ", options_.max_fds,
          " from RLIMIT_NOFILE); entry not kept (raise the keeper's open-file limit)");
      WC_LOG_WARN("keeper: %s", why);
      return SendMessage(fd, ErrorMessage(absl::ResourceExhaustedError(why)));
    }
    fds_ += m.nfds;  // reserved while they cross
  }
  auto release_reservation = [&] {
    MutexLock l(mu_);
    fds_ -= m.nfds;
  };
  if (auto s = SendMessage(fd, MessageOf(Op::kProceed)); !s.ok()) {
    release_reservation();
    return s;
  }
  auto fds = RecvFds(fd, m.nfds);
  if (!fds.ok()) {
    release_reservation();
    (void)SendMessage(fd, ErrorMessage(fds.status()));
    return fds.status();  // the stream may be out of step: end the connection
  }
  auto held = std::make_shared<Held>();
  held->body = std::move(m.body);
  held->fds = std::move(fds).value();
  std::shared_ptr<const Held> replaced;
  {
    MutexLock l(mu_);
    auto& slot = entries_[m.key];
    replaced = std::move(slot);
    if (replaced) fds_ -= replaced->fds.size();
    slot = std::move(held);
  }
  WC_LOG_INFO("keeper: holds %s (%d descriptors%s)", m.key, static_cast<int>(m.nfds),
              replaced ? ", replacing its earlier deposit" : "");
  return SendMessage(fd, MessageOf(Op::kOk));
}

absl::Status Keeper::Adopt(int fd) {
  std::vector<std::pair<std::string, std::shared_ptr<const Held>>> all;
  {
    MutexLock l(mu_);
    all.assign(entries_.begin(), entries_.end());
  }
  for (const auto& [key, held] : all) {
    Message e = MessageOf(Op::kEntry);
    e.key = key;
    e.body = held->body;
    e.nfds = static_cast<uint32_t>(held->fds.size());
    WC_RETURN_IF_ERROR(SendMessage(fd, e));
    std::vector<int> raw;
    raw.reserve(held->fds.size());
    for (const auto& f : held->fds) raw.push_back(f.get());
    WC_RETURN_IF_ERROR(SendFds(fd, raw));
  }
  Message end = MessageOf(Op::kEnd);
  end.body = std::to_string(all.size());
  WC_LOG_INFO("keeper: handed %d entries to an adopting daemon", static_cast<int>(all.size()));
  return SendMessage(fd, end);
}

}  // namespace weightcache::keeper
