// The sockets of the peer port (peer_port.h): its TCP listeners, a connection's source as
// gRPC would spell it, the relay's Unix connection to gRPC with a name of its own, and the
// descriptor checks. Not a public header. Thread-safety: free functions on descriptors the
// caller owns.
#pragma once

#include <sys/socket.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "pkg/util/scoped_fd.h"

namespace weightcache::server {

// Non-blocking listening sockets for "host:port" ("[v6]:port"; host "" or "*": every
// address), one per address the host resolves to, all on one port (port 0: the one the first
// got, returned in `bound_port`).
absl::StatusOr<std::vector<ScopedFd>> ListenTcp(const std::string& listen, int backlog,
                                                int* bound_port);

// An accepted connection's source: the IP alone (the per-address cap's key) and
// "ipv4:10.1.2.3:40512" / "ipv6:[fd00::7]:40512" (gRPC's spelling; an IPv4-mapped IPv6
// address as IPv4).
struct TcpSource {
  std::string address;
  std::string source;
};
TcpSource TcpSourceOf(const sockaddr_storage& ss);

// A non-blocking Unix connection to `path` from a socket bound to an abstract name the kernel
// chose (autobind), and gRPC's peer string for it ("unix-abstract:1f3a9"; empty when the
// socket could not be named). The error's errno (EMFILE for the socket; EAGAIN when the
// listener's backlog is full, ECONNREFUSED or ENOENT when it is gone) is in `*err`.
struct NamedConnection {
  ScopedFd fd;
  std::string name;
};
absl::StatusOr<NamedConnection> ConnectNamed(const std::string& path, int* err);

}  // namespace weightcache::server
