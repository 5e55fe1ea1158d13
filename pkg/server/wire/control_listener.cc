#include "pkg/server/wire/control_listener.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "pkg/util/errno_status.h"
#include "pkg/util/log.h"
#include "pkg/util/status_macros.h"
#include "pkg/util/unix_socket.h"

namespace weightcache::server {
namespace {

constexpr int kTickMs = 200;     // reaping closed connections
constexpr int kBackoffMs = 100;  // after EMFILE/ENFILE
constexpr int kBacklog = 512;

}  // namespace

absl::StatusOr<std::unique_ptr<ControlListener>> ControlListener::Start(Options options,
                                                                        Serve serve) {
  std::vector<Listening> listening;
  auto listen = [&](const std::string& path, const std::string& slot,
                    SocketKind kind) -> absl::Status {
    WC_ASSIGN_OR_RETURN(ScopedFd fd,
                        ListenUnix(path, kind == SocketKind::kAdmin ? 0600 : 0660, kBacklog));
    // Non-blocking: the loop drains the backlog until EAGAIN.
    const int flags = ::fcntl(fd.get(), F_GETFL);
    if (flags < 0 || ::fcntl(fd.get(), F_SETFL, flags | O_NONBLOCK) != 0) {
      return ErrnoStatus(errno, "fcntl O_NONBLOCK", path);
    }
    listening.push_back({std::move(fd), slot, kind});
    return absl::OkStatus();
  };
  WC_RETURN_IF_ERROR(listen(options.path, "", SocketKind::kEngine));
  for (const auto& s : options.slot_sockets) {
    WC_RETURN_IF_ERROR(listen(s.path, s.slot, SocketKind::kSlot));
  }
  if (!options.admin_path.empty()) {
    WC_RETURN_IF_ERROR(listen(options.admin_path, "", SocketKind::kAdmin));
  }
  ScopedFd wake(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wake) return ErrnoStatus(errno, "eventfd");
  ConnectionRelay::Options ro;
  ro.max_streams = options.max_streams_per_connection;
  ro.on_closed = options.on_relay_closed;
  WC_ASSIGN_OR_RETURN(auto relay, ConnectionRelay::Start(std::move(ro)));
  return std::unique_ptr<ControlListener>(new ControlListener(std::move(options),
                                                              std::move(listening), std::move(wake),
                                                              std::move(relay), std::move(serve)));
}

ControlListener::ControlListener(Options options, std::vector<Listening> listening, ScopedFd wake,
                                 std::unique_ptr<ConnectionRelay> relay, Serve serve)
    : options_(std::move(options)),
      resolver_(options_.proc_root),
      listening_(std::move(listening)),
      wake_(std::move(wake)),
      relay_(std::move(relay)),
      serve_(std::move(serve)),
      conns_(
          ConnectionTable::Limits{.max_connections = options_.max_connections,
                                  .max_connections_per_pod = options_.max_connections_per_pod,
                                  .max_connections_unresolved = options_.max_connections_unresolved,
                                  .over_cap_held = options_.over_cap_held}) {
  thread_ = std::thread(&ControlListener::Loop, this);
}

ControlListener::~ControlListener() { CloseConnections(); }

void ControlListener::CloseConnections() {
  StopAccepting();
  relay_.reset();
  MutexLock l(mu_);
  conns_.Clear();
}

void ControlListener::StopAccepting() {
  if (!thread_.joinable()) return;
  stop_ = true;
  uint64_t one = 1;
  (void)::write(wake_.get(), &one, sizeof one);
  thread_.join();
  ::unlink(options_.path.c_str());
  for (const auto& s : options_.slot_sockets) ::unlink(s.path.c_str());
  if (!options_.admin_path.empty()) ::unlink(options_.admin_path.c_str());
}

std::optional<ControlListener::Caller> ControlListener::PeerOf(const std::string& peer) const {
  int fd = -1;
  if (peer.rfind("fd:", 0) != 0 || !absl::SimpleAtoi(peer.substr(3), &fd)) return std::nullopt;
  MutexLock l(mu_);
  // The inode is read under the lock: the number cannot be recorded for another connection
  // meanwhile (Insert also runs under it).
  return conns_.Find(fd, SocketInode(fd));
}

ControlListener::Counters ControlListener::counters() const {
  MutexLock l(mu_);
  Counters c = counters_;
  c.open = conns_.size();
  return c;
}

void ControlListener::Loop() {
  auto backoff_until = std::chrono::steady_clock::time_point{};
  auto next_reap = std::chrono::steady_clock::now();
  std::vector<pollfd> fds;
  while (!stop_) {
    const auto now = std::chrono::steady_clock::now();
    const bool backing_off = now < backoff_until;
    // After a shortage, descriptors being back is what readiness needs to know, not whether
    // someone connected since.
    if (!backing_off && !healthy_.load()) ProbeDescriptors();
    fds.assign(1, {wake_.get(), POLLIN, 0});
    // While backing off, the listening sockets are left out (-1: poll ignores them).
    for (const auto& l : listening_) fds.push_back({backing_off ? -1 : l.fd.get(), POLLIN, 0});
    const int n = ::poll(fds.data(), fds.size(), backing_off ? kBackoffMs : kTickMs);
    if (n < 0 && errno != EINTR) {
      WC_LOG_ERROR("control listener: poll: %s", std::strerror(errno));
      std::this_thread::sleep_for(std::chrono::milliseconds(kBackoffMs));
    }
    if (fds[0].revents & POLLIN) {
      uint64_t v;
      (void)::read(wake_.get(), &v, sizeof v);
    }
    if (stop_) break;
    for (size_t i = 0; i < listening_.size() && !backing_off && !stop_; ++i) {
      if ((fds[i + 1].revents & POLLIN) != 0 && !AcceptFrom(listening_[i])) {
        backoff_until = std::chrono::steady_clock::now() + std::chrono::milliseconds(kBackoffMs);
        break;
      }
    }
    if (std::chrono::steady_clock::now() >= next_reap) {
      MutexLock l(mu_);
      Reap();
      next_reap = std::chrono::steady_clock::now() + std::chrono::milliseconds(kTickMs);
    }
  }
}

bool ControlListener::AcceptFrom(const Listening& from) {
  // Drain the backlog; on EMFILE/ENFILE back off instead of spinning on a readable socket.
  for (int i = 0; i < 64 && !stop_; ++i) {
    ScopedFd conn(::accept4(from.fd.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
    if (!conn) {
      const int err = errno;
      if (err == EAGAIN || err == EINTR || err == ECONNABORTED) return true;
      MutexLock l(mu_);
      counters_.accept_errors++;
      if (healthy_.exchange(false)) {
        WC_LOG_ERROR(
            "control socket: accept: %s; retrying every %d ms until descriptors "
            "are free (raise the open-file limit?)",
            std::strerror(err), kBackoffMs);
      }
      return false;
    }
    if (!healthy_.exchange(true)) WC_LOG_INFO("control socket: accepting again");
    auto cred = GetPeerCred(conn.get());
    if (!cred.ok()) continue;  // the peer went away
    // The unit, read before the lock: the peer's /proc entry (two small files).
    tenant::Unit unit = from.kind == SocketKind::kSlot ? tenant::Unit::OfSlot(from.slot, cred->pid)
                                                       : resolver_.Resolve(cred->pid, conn.get());
    MutexLock l(mu_);
    const auto& allowed = options_.allowed_uids;
    if (!allowed.empty() && std::find(allowed.begin(), allowed.end(), cred->uid) == allowed.end()) {
      counters_.refused_uid++;
      WC_LOG_WARN("control socket: uid %d (pid %d) is not in --allowed_uids; closed", cred->uid,
                  cred->pid);
      continue;
    }
    Reap();
    const ConnectionTable::Admission admit = conns_.Admit(unit.Key());
    if (admit == ConnectionTable::Admission::kCloseTotal) {
      counters_.refused_total++;
      WC_LOG_WARN("control socket: %d connections open (--max_connections); %s closed",
                  conns_.size(), unit.Describe());
      continue;
    }
    if (admit == ConnectionTable::Admission::kCloseUnitCap) {
      // Logged once per burst: the unit already holds connections that tell it why.
      if (counters_.refused_unit_cap++ % 1024 == 0) {
        WC_LOG_WARN(
            "control socket: %s holds %d connections, past %s=%d and %d more that are "
            "answered RESOURCE_EXHAUSTED; closed at accept",
            unit.Describe(), conns_.OfUnit(unit.Key()),
            unit.unresolved() ? "--max_connections_unresolved" : "--max_connections_per_pod",
            conns_.CapOf(unit.Key()), options_.over_cap_held);
      }
      continue;
    }
    Caller caller;
    caller.cred = *cred;
    caller.unit = std::move(unit);
    caller.over_cap = admit == ConnectionTable::Admission::kServeOverCap;
    caller.slot = from.slot;
    caller.socket = from.kind;
    caller.accepted = std::chrono::steady_clock::now();
    auto fd = relay_->Add(std::move(conn), absl::StrCat(caller.unit.Describe(), " uid ", cred->uid,
                                                        " pid ", cred->pid));
    if (!fd.ok()) {  // out of descriptors for the socket pair: as for accept
      counters_.accept_errors++;
      if (healthy_.exchange(false)) {
        WC_LOG_ERROR(
            "control socket: %s; retrying every %d ms until descriptors are free (raise "
            "the open-file limit?)",
            std::string(fd.status().message()), kBackoffMs);
      }
      return false;
    }
    counters_.accepted++;
    conns_.Insert(*fd, SocketInode(*fd),
                  std::move(caller));  // `serve_` owns the descriptor from here
    serve_(*fd);
  }
  return true;
}

void ControlListener::ProbeDescriptors() {
  // A connection takes three: the accepted one and the relay's socket pair.
  ScopedFd probes[3];
  for (ScopedFd& p : probes) {
    p = ScopedFd(::fcntl(listening_[0].fd.get(), F_DUPFD_CLOEXEC, 0));
    if (!p) return;
  }
  if (!healthy_.exchange(true)) WC_LOG_INFO("control socket: accepting again");
}

void ControlListener::Reap() {
  // gRPC closes connections without telling: a descriptor whose inode changed (or that is
  // closed) is a connection gone.
  conns_.Reap(SocketInode);
}

}  // namespace weightcache::server
