// A tiny SCM_RIGHTS channel for the GPU tests and benchmark: sends many descriptors plus a
// short text payload over a SOCK_SEQPACKET Unix socketpair (message boundaries kept), in
// batches below the kernel's 253-descriptors-per-message limit.
// Test-only: the daemon's handle channel lives in pkg/server. Header-only so bench/ can use it.
// Thread-safety: none needed (one sender, one receiver per socket).
#pragma once

#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "pkg/util/errno_status.h"
#include "pkg/util/scoped_fd.h"

namespace weightcache::gputest {

inline constexpr size_t kFdsPerMessage = 250;

// Message 1: "WCFD <count> <payload bytes>\n<payload>" with the first batch of descriptors;
// then one message per further batch ("+"), each with its descriptors.
inline absl::Status SendFds(int sock, const std::vector<int>& fds, const std::string& payload) {
  size_t sent = 0;
  bool first = true;
  while (first || sent < fds.size()) {
    std::string data = first ? "WCFD " + std::to_string(fds.size()) + " " +
                                   std::to_string(payload.size()) + "\n" + payload
                             : std::string("+");
    size_t n = std::min(kFdsPerMessage, fds.size() - sent);
    std::vector<char> control(CMSG_SPACE(sizeof(int) * std::max<size_t>(n, 1)), 0);
    iovec iov{data.data(), data.size()};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    if (n > 0) {
      msg.msg_control = control.data();
      msg.msg_controllen = CMSG_SPACE(sizeof(int) * n);
      cmsghdr* c = CMSG_FIRSTHDR(&msg);
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(sizeof(int) * n);
      std::memcpy(CMSG_DATA(c), fds.data() + sent, sizeof(int) * n);
    }
    ssize_t r;
    do {
      r = ::sendmsg(sock, &msg, MSG_NOSIGNAL);
    } while (r < 0 && errno == EINTR);
    if (r < 0) return ErrnoStatus(errno, "sendmsg SCM_RIGHTS");
    sent += n;
    first = false;
  }
  return absl::OkStatus();
}

struct ReceivedFds {
  std::vector<ScopedFd> fds;
  std::string payload;
};

inline absl::StatusOr<ReceivedFds> RecvFds(int sock) {
  ReceivedFds out;
  size_t expected = 0;
  bool first = true;
  std::vector<char> data(1 << 20);
  while (first || out.fds.size() < expected) {
    std::vector<char> control(CMSG_SPACE(sizeof(int) * kFdsPerMessage), 0);
    iovec iov{data.data(), data.size()};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.data();
    msg.msg_controllen = control.size();
    ssize_t r;
    do {
      r = ::recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
    } while (r < 0 && errno == EINTR);
    if (r < 0) return ErrnoStatus(errno, "recvmsg SCM_RIGHTS");
    if (r == 0) return absl::UnavailableError("fd channel: peer closed before sending all FDs");
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < n; ++i) {
        int fd;
        std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
        out.fds.emplace_back(fd);
      }
    }
    if (msg.msg_flags & (MSG_CTRUNC | MSG_TRUNC)) {
      return absl::ResourceExhaustedError("fd channel: message or descriptors truncated");
    }
    if (first) {
      std::string head(data.data(), static_cast<size_t>(r));
      size_t count = 0, len = 0;
      int used = 0;
      if (std::sscanf(head.c_str(), "WCFD %zu %zu\n%n", &count, &len, &used) != 2 || used <= 0 ||
          head.size() != static_cast<size_t>(used) + len) {
        return absl::DataLossError("fd channel: bad header");
      }
      expected = count;
      out.payload = head.substr(static_cast<size_t>(used));
      first = false;
    }
  }
  if (out.fds.size() != expected) return absl::DataLossError("fd channel: too many FDs");
  return out;
}

}  // namespace weightcache::gputest
