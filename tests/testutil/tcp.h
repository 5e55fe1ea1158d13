// TCP clients for flood and cap tests of the peer port: connections from chosen local
// addresses (all of 127/8 is local, so each address is a distinct source), whether the server
// closed one, and how many descriptors this process holds.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <chrono>
#include <filesystem>
#include <string>

#include "pkg/util/scoped_fd.h"

namespace weightcache::testing {

// A TCP connection to 127.0.0.1:`port` from address `from` (e.g. "127.0.0.2") that sends
// nothing; an empty ScopedFd when it cannot be made.
inline ScopedFd ConnectFrom(const std::string& from, int port) {
  ScopedFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd) return fd;
  sockaddr_in src{};
  src.sin_family = AF_INET;
  ::inet_pton(AF_INET, from.c_str(), &src.sin_addr);
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&src), sizeof src) != 0) return ScopedFd();
  sockaddr_in dst{};
  dst.sin_family = AF_INET;
  dst.sin_port = htons(static_cast<uint16_t>(port));
  dst.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&dst), sizeof dst) != 0) return ScopedFd();
  return fd;
}

// Whether the other side closed `fd` (EOF or reset); does not wait.
inline bool ClosedNow(int fd) {
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, 0) <= 0) return false;
  char c;
  const ssize_t r = ::recv(fd, &c, 1, MSG_DONTWAIT);
  return r == 0 || (r < 0 && errno != EAGAIN);
}

// Whether the other side closed `fd` (EOF, reset or hang-up) within `ms`; what it sent
// meanwhile is read and dropped.
inline bool ClosedWithin(int fd, int ms) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  while (true) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        until - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
    if ((p.revents & (POLLHUP | POLLERR)) != 0) return true;
    char buf[4096];
    const ssize_t r = ::recv(fd, buf, sizeof buf, MSG_DONTWAIT);
    if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR)) return true;
  }
}

// Descriptors this process holds now.
inline size_t OpenDescriptors() {
  size_t n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) ++n;
  return n;
}

}  // namespace weightcache::testing
