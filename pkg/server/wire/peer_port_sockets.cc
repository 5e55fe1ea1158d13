#include "pkg/server/wire/peer_port_sockets.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/un.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "pkg/util/errno_status.h"

namespace weightcache::server {
namespace {

absl::Status SplitListen(const std::string& listen, std::string* host, std::string* port) {
  const size_t colon = listen.rfind(':');
  if (colon == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat("'", listen, "' is not host:port"));
  }
  *host = listen.substr(0, colon);
  *port = listen.substr(colon + 1);
  if (host->size() >= 2 && host->front() == '[' && host->back() == ']') {
    *host = host->substr(1, host->size() - 2);
  }
  if (*host == "*") host->clear();
  int n = -1;
  if (!absl::SimpleAtoi(*port, &n) || n < 0 || n > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("'", listen, "': bad port"));
  }
  return absl::OkStatus();
}

int PortOf(const sockaddr_storage& ss) {
  return ntohs(ss.ss_family == AF_INET ? reinterpret_cast<const sockaddr_in&>(ss).sin_port
                                       : reinterpret_cast<const sockaddr_in6&>(ss).sin6_port);
}

// One listening socket on `a`, on `port` unless 0 (then `a`'s own).
absl::StatusOr<ScopedFd> ListenOn(const addrinfo& a, bool v6_only, int port, int backlog) {
  ScopedFd fd(::socket(a.ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd) return ErrnoStatus(errno, "socket");
  const int one = 1;
  (void)::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (a.ai_family == AF_INET6 && v6_only) {
    (void)::setsockopt(fd.get(), IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
  }
  sockaddr_storage ss{};
  std::memcpy(&ss, a.ai_addr, a.ai_addrlen);
  if (port != 0 && ss.ss_family == AF_INET) {
    reinterpret_cast<sockaddr_in&>(ss).sin_port = htons(static_cast<uint16_t>(port));
  }
  if (port != 0 && ss.ss_family == AF_INET6) {
    reinterpret_cast<sockaddr_in6&>(ss).sin6_port = htons(static_cast<uint16_t>(port));
  }
  if (::bind(fd.get(), reinterpret_cast<const sockaddr*>(&ss), a.ai_addrlen) != 0) {
    return ErrnoStatus(errno, "bind");
  }
  if (::listen(fd.get(), backlog) != 0) return ErrnoStatus(errno, "listen");
  return fd;
}

}  // namespace

absl::StatusOr<std::vector<ScopedFd>> ListenTcp(const std::string& listen, int backlog,
                                                int* bound_port) {
  std::string host, port;
  if (absl::Status s = SplitListen(listen, &host, &port); !s.ok()) return s;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  if (const int e =
          ::getaddrinfo(host.empty() ? nullptr : host.c_str(), port.c_str(), &hints, &res);
      e != 0) {
    return absl::UnavailableError(absl::StrCat("'", host, "': ", ::gai_strerror(e)));
  }
  std::vector<const addrinfo*> addrs;
  for (const addrinfo* a = res; a != nullptr; a = a->ai_next) {
    if (a->ai_family == AF_INET || a->ai_family == AF_INET6) addrs.push_back(a);
  }
  std::vector<ScopedFd> out;
  absl::Status err;
  int chosen = 0;
  for (const addrinfo* a : addrs) {
    // With an IPv4 address beside it, an IPv6 socket takes IPv6 only (else they collide).
    auto fd = ListenOn(*a, /*v6_only=*/addrs.size() > 1, chosen, backlog);
    if (!fd.ok()) {
      err = fd.status();
      break;
    }
    sockaddr_storage got{};
    socklen_t len = sizeof got;
    if (::getsockname(fd->get(), reinterpret_cast<sockaddr*>(&got), &len) != 0) {
      err = ErrnoStatus(errno, "getsockname");
      break;
    }
    chosen = PortOf(got);
    out.push_back(*std::move(fd));
  }
  ::freeaddrinfo(res);
  if (!err.ok()) return err;
  if (out.empty()) return absl::UnavailableError(absl::StrCat("'", host, "': no address"));
  *bound_port = chosen;
  return out;
}

TcpSource TcpSourceOf(const sockaddr_storage& ss) {
  char ip[INET6_ADDRSTRLEN] = {};
  if (ss.ss_family == AF_INET) {
    const auto& a = reinterpret_cast<const sockaddr_in&>(ss);
    ::inet_ntop(AF_INET, &a.sin_addr, ip, sizeof ip);
    return {ip, absl::StrCat("ipv4:", ip, ":", ntohs(a.sin_port))};
  }
  if (ss.ss_family == AF_INET6) {
    const auto& a = reinterpret_cast<const sockaddr_in6&>(ss);
    if (IN6_IS_ADDR_V4MAPPED(&a.sin6_addr)) {  // a dual-stack socket's IPv4 peer
      ::inet_ntop(AF_INET, &a.sin6_addr.s6_addr[12], ip, sizeof ip);
      return {ip, absl::StrCat("ipv4:", ip, ":", ntohs(a.sin6_port))};
    }
    ::inet_ntop(AF_INET6, &a.sin6_addr, ip, sizeof ip);
    return {ip, absl::StrCat("ipv6:[", ip, "]:", ntohs(a.sin6_port))};
  }
  return {"?", "unknown"};
}

absl::StatusOr<NamedConnection> ConnectNamed(const std::string& path, int* err) {
  NamedConnection c;
  c.fd = ScopedFd(::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!c.fd) {
    *err = errno;
    return ErrnoStatus(errno, "socket");
  }
  sockaddr_un un{};
  un.sun_family = AF_UNIX;
  // Only the family: the kernel binds an abstract name of its choosing (unix(7), autobind).
  if (::bind(c.fd.get(), reinterpret_cast<const sockaddr*>(&un), sizeof(sa_family_t)) == 0) {
    sockaddr_un got{};
    socklen_t len = sizeof got;
    if (::getsockname(c.fd.get(), reinterpret_cast<sockaddr*>(&got), &len) == 0 &&
        len > sizeof(sa_family_t) + 1 && got.sun_path[0] == '\0') {
      c.name = absl::StrCat("unix-abstract:",
                            std::string(got.sun_path + 1, len - sizeof(sa_family_t) - 1));
    }
  }
  if (path.size() >= sizeof un.sun_path) {
    *err = ENAMETOOLONG;
    return absl::InvalidArgumentError("socket path too long: " + path);
  }
  std::memcpy(un.sun_path, path.data(), path.size());
  if (::connect(c.fd.get(), reinterpret_cast<const sockaddr*>(&un), sizeof un) != 0) {
    *err = errno;
    return ErrnoStatus(errno, "connect", path);
  }
  return c;
}

}  // namespace weightcache::server
