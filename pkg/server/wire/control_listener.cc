#include "pkg/server/wire/control_listener.h"

#include <sys/socket.h>
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

constexpr int kReapMs = 200;  // reaping connections gRPC closed
constexpr int kBacklog = 512;
// The tags of the listening sockets: the shared one, the admin one, a slot's ("slot:<id>").
constexpr char kEngineTag[] = "engine";
constexpr char kAdminTag[] = "admin";
constexpr char kSlotTagPrefix[] = "slot:";

}  // namespace

absl::StatusOr<std::unique_ptr<ControlListener>> ControlListener::Start(Options options,
                                                                        Serve serve) {
  std::vector<std::pair<ScopedFd, std::string>> listening;
  auto listen = [&](const std::string& path, std::string tag, mode_t mode) -> absl::Status {
    WC_ASSIGN_OR_RETURN(ScopedFd fd, ListenUnix(path, mode, kBacklog));
    listening.emplace_back(std::move(fd), std::move(tag));
    return absl::OkStatus();
  };
  WC_RETURN_IF_ERROR(listen(options.path, kEngineTag, 0660));
  for (const auto& s : options.slot_sockets) {
    WC_RETURN_IF_ERROR(listen(s.path, kSlotTagPrefix + s.slot, 0660));
  }
  if (!options.admin_path.empty()) WC_RETURN_IF_ERROR(listen(options.admin_path, kAdminTag, 0600));
  ConnectionRelay::Options ro;
  ro.max_streams = options.max_streams_per_connection;
  ro.on_closed = options.on_relay_closed;
  WC_ASSIGN_OR_RETURN(auto relay, ConnectionRelay::Start(std::move(ro)));
  auto l = std::unique_ptr<ControlListener>(
      new ControlListener(std::move(options), std::move(relay), std::move(serve)));
  net::ListenerOptions a;
  a.name = "control";
  a.limits = {.total = l->options_.max_connections,
              .per_key = l->options_.max_connections_per_pod,
              .over_cap = l->options_.over_cap_held,
              .own_caps = {{tenant::kUnresolvedKey, l->options_.max_connections_unresolved}}};
  a.first_byte = l->options_.first_byte;
  a.idle = l->options_.idle;
  a.fds_per_connection = 2;  // the relay's socket pair
  a.identify = [raw = l.get()](int fd, const std::string& tag) { return raw->Identify(fd, tag); };
  a.serve = [raw = l.get()](net::Accepted c) { return raw->Take(std::move(c)); };
  a.on_refused = l->options_.on_refused;
  WC_ASSIGN_OR_RETURN(l->acceptor_, net::Acceptor::Start(std::move(a)));
  for (auto& [fd, tag] : listening) WC_RETURN_IF_ERROR(l->acceptor_->Listen(std::move(fd), tag));
  return l;
}

ControlListener::ControlListener(Options options, std::unique_ptr<ConnectionRelay> relay,
                                 Serve serve)
    : options_(std::move(options)),
      resolver_(options_.proc_root),
      relay_(std::move(relay)),
      serve_(std::move(serve)) {}

ControlListener::~ControlListener() { CloseConnections(); }

void ControlListener::CloseConnections() {
  StopAccepting();
  relay_.reset();  // closes every connection, and gives their places back
  MutexLock l(mu_);
  conns_.Clear();
}

void ControlListener::StopAccepting() {
  if (stopped_) return;
  stopped_ = true;
  if (acceptor_ != nullptr) acceptor_->Stop();
  ::unlink(options_.path.c_str());
  for (const auto& s : options_.slot_sockets) ::unlink(s.path.c_str());
  if (!options_.admin_path.empty()) ::unlink(options_.admin_path.c_str());
  pods_.UnlinkAll();
}

absl::Status ControlListener::AddPodSocket(const std::string& path, const tenant::Unit& pod) {
  return pods_.Add(*acceptor_, path, pod, kBacklog);
}

void ControlListener::RemovePodSocket(const std::string& uid) { pods_.Remove(*acceptor_, uid); }

std::optional<ControlListener::Caller> ControlListener::PeerOf(const std::string& peer) const {
  int fd = -1;
  if (peer.rfind("fd:", 0) != 0 || !absl::SimpleAtoi(peer.substr(3), &fd)) return std::nullopt;
  std::optional<Caller> c;
  {
    MutexLock l(mu_);
    // The inode is read under the lock: the number cannot be recorded for another connection
    // meanwhile (Insert also runs under it).
    c = conns_.Find(fd, SocketInode(fd));
  }
  if (c) {
    c->unit_connections = acceptor_->limiter().HeldBy(c->unit.Key());
    c->unit_cap = acceptor_->limiter().CapOf(c->unit.Key());
  }
  return c;
}

absl::StatusOr<net::Identity> ControlListener::Identify(int fd, const std::string& tag) {
  WC_ASSIGN_OR_RETURN(PeerCred cred, GetPeerCred(fd));
  const auto& allowed = options_.allowed_uids;
  if (!allowed.empty() && std::find(allowed.begin(), allowed.end(), cred.uid) == allowed.end()) {
    return absl::PermissionDeniedError(
        absl::StrCat("uid ", cred.uid, " (pid ", cred.pid, ") is not in --allowed_uids"));
  }
  Caller caller;
  caller.cred = cred;
  if (tag == kAdminTag) {
    caller.socket = SocketKind::kAdmin;
  } else if (tag.rfind(kSlotTagPrefix, 0) == 0) {
    caller.socket = SocketKind::kSlot;
    caller.slot = tag.substr(sizeof kSlotTagPrefix - 1);
  } else if (PodSocketBook::IsPodTag(tag)) {
    caller.socket = SocketKind::kPod;
    caller.slot = tag;
  }
  // The unit: the pod the kubelet named for its socket, the slot's, or the peer's /proc entry
  // (two small files).
  if (caller.socket == SocketKind::kPod) {
    std::optional<tenant::Unit> pod = pods_.UnitOf(tag, cred.pid);
    if (!pod) return absl::UnavailableError("the pod's socket was removed");
    caller.unit = std::move(*pod);
  } else if (caller.socket == SocketKind::kSlot) {
    caller.unit = tenant::Unit::OfSlot(caller.slot, cred.pid);
  } else {
    caller.unit = resolver_.Resolve(cred.pid, fd);
  }
  net::Identity id;
  id.key = caller.unit.Key();
  id.describe = caller.unit.Describe();
  id.detail = std::move(caller);
  return id;
}

bool ControlListener::Take(net::Accepted a) {
  Caller caller = std::any_cast<Caller>(std::move(a.who.detail));
  caller.over_cap = a.over_cap;
  caller.accepted = a.accepted;
  auto fd = relay_->Add(
      std::move(a.fd), std::move(a.slot),
      absl::StrCat(caller.unit.Describe(), " uid ", caller.cred.uid, " pid ", caller.cred.pid),
      std::move(a.activity));
  if (!fd.ok()) return false;  // out of descriptors for the socket pair: the acceptor backs off
  MutexLock l(mu_);
  const auto now = std::chrono::steady_clock::now();
  if (now >= next_reap_) {
    // gRPC closes connections without telling: a descriptor whose inode changed (or that is
    // closed) is a connection gone.
    conns_.Reap(SocketInode);
    next_reap_ = now + std::chrono::milliseconds(kReapMs);
  }
  conns_.Insert(*fd, SocketInode(*fd), std::move(caller));  // `serve_` owns the descriptor now
  serve_(*fd);
  return true;
}

}  // namespace weightcache::server
