#include "pkg/util/unix_socket.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "pkg/util/errno_status.h"
#include "pkg/util/log.h"

namespace weightcache {
namespace {

absl::StatusOr<sockaddr_un> Address(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("socket path '", path, "' is ", path.size(),
                                                   " bytes; the limit is ",
                                                   sizeof(addr.sun_path) - 1));
  }
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  return addr;
}

}  // namespace

absl::Status ChangeGroup(const std::string& path, int gid) {
  if (::chown(path.c_str(), static_cast<uid_t>(-1), static_cast<gid_t>(gid)) != 0) {
    return ErrnoStatus(errno, "chown to group " + std::to_string(gid), path);
  }
  return absl::OkStatus();
}

absl::Status PrepareSocketDir(const std::string& dir, mode_t mode) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec)
    return absl::PermissionDeniedError(absl::StrCat("create socket dir ", dir, ": ", ec.message()));
  struct stat st;
  if (::lstat(dir.c_str(), &st) != 0) return ErrnoStatus(errno, "lstat", dir);
  if (!S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat("socket dir ", dir, " is not a directory (a symlink or a file is refused)"));
  }
  if (st.st_uid != ::geteuid()) {
    return absl::PermissionDeniedError(absl::StrCat("socket dir ", dir, " is owned by uid ",
                                                    st.st_uid, ", not by this process (uid ",
                                                    ::geteuid(), ")"));
  }
  if (::chmod(dir.c_str(), mode) != 0) return ErrnoStatus(errno, "chmod", dir);
  return absl::OkStatus();
}

absl::Status RemoveStaleSocket(const std::string& path, int type) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return absl::OkStatus();
    return ErrnoStatus(errno, "lstat", path);
  }
  if (!S_ISSOCK(st.st_mode)) {
    const char* what = S_ISREG(st.st_mode)    ? "a regular file"
                       : S_ISDIR(st.st_mode)  ? "a directory"
                       : S_ISLNK(st.st_mode)  ? "a symlink"
                       : S_ISFIFO(st.st_mode) ? "a FIFO"
                                              : "not a socket";
    if (S_ISDIR(st.st_mode) || st.st_uid != ::geteuid()) {
      return absl::FailedPreconditionError(absl::StrCat(
          path, " is ", what, " owned by uid ", st.st_uid, ", not a socket; refusing to remove it",
          S_ISDIR(st.st_mode) ? "" : " (only what this daemon's own uid owns is replaced)"));
    }
    if (::unlink(path.c_str()) != 0) return ErrnoStatus(errno, "unlink", path);
    WC_LOG_WARN("%s was %s, not a socket; removed it (this uid owns it) to listen there", path,
                what);
    return absl::OkStatus();
  }
  auto live = ConnectUnix(path, type);
  if (live.ok()) {
    return absl::AlreadyExistsError(
        absl::StrCat(path, ": another server is answering on this socket"));
  }
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) return ErrnoStatus(errno, "unlink", path);
  return absl::OkStatus();
}

absl::StatusOr<ScopedFd> ListenUnix(const std::string& path, mode_t mode, int backlog, int type) {
  auto addr = Address(path);
  if (!addr.ok()) return addr.status();
  ScopedFd fd(::socket(AF_UNIX, type | SOCK_CLOEXEC, 0));
  if (!fd) return ErrnoStatus(errno, "socket");
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&*addr), sizeof(*addr)) != 0) {
    return ErrnoStatus(errno, "bind", path);
  }
  if (::chmod(path.c_str(), mode) != 0) return ErrnoStatus(errno, "chmod", path);
  if (::listen(fd.get(), backlog) != 0) return ErrnoStatus(errno, "listen", path);
  return fd;
}

absl::StatusOr<ScopedFd> ConnectUnix(const std::string& path, int type) {
  auto addr = Address(path);
  if (!addr.ok()) return addr.status();
  ScopedFd fd(::socket(AF_UNIX, type | SOCK_CLOEXEC, 0));
  if (!fd) return ErrnoStatus(errno, "socket");
  int rc;
  do {
    rc = ::connect(fd.get(), reinterpret_cast<sockaddr*>(&*addr), sizeof(*addr));
  } while (rc != 0 && errno == EINTR);
  if (rc != 0) return ErrnoStatus(errno, "connect", path);
  return fd;
}

absl::StatusOr<ScopedFd> ConnectUnixNoWait(const std::string& path, int type) {
  auto addr = Address(path);
  if (!addr.ok()) return addr.status();
  ScopedFd fd(::socket(AF_UNIX, type | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd) return ErrnoStatus(errno, "socket");
  int rc;
  do {
    rc = ::connect(fd.get(), reinterpret_cast<sockaddr*>(&*addr), sizeof(*addr));
  } while (rc != 0 && errno == EINTR);
  if (rc != 0 && errno == EAGAIN) {
    return absl::UnavailableError(
        absl::StrCat("connect ", path, ": the server's backlog is full (it stopped accepting)"));
  }
  if (rc != 0) return ErrnoStatus(errno, "connect", path);
  const int flags = ::fcntl(fd.get(), F_GETFL);
  if (flags < 0 || ::fcntl(fd.get(), F_SETFL, flags & ~O_NONBLOCK) != 0) {
    return ErrnoStatus(errno, "fcntl", path);
  }
  return fd;
}

absl::StatusOr<PeerCred> GetPeerCred(int fd) {
  struct ucred cred;
  socklen_t len = sizeof cred;
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    return ErrnoStatus(errno, "getsockopt SO_PEERCRED");
  }
  return PeerCred{cred.pid, cred.uid, cred.gid};
}

absl::Status SendWithFds(int sock, const std::string& data, const std::vector<int>& fds) {
  if (fds.size() > kMaxFdsPerMessage) {
    return absl::InvalidArgumentError(
        absl::StrCat("SendWithFds: ", fds.size(), " descriptors; at most ", kMaxFdsPerMessage));
  }
  if (data.empty()) return absl::InvalidArgumentError("SendWithFds: empty payload");
  iovec iov{const_cast<char*>(data.data()), data.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFdsPerMessage)];
  if (!fds.empty()) {
    msg.msg_control = control;
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  }
  ssize_t n;
  do {
    n = ::sendmsg(sock, &msg, MSG_NOSIGNAL);
  } while (n < 0 && errno == EINTR);
  if (n < 0) return ErrnoStatus(errno, "sendmsg");
  // The descriptors went with the first byte; the rest of the payload goes plainly.
  if (static_cast<size_t>(n) < data.size()) return WriteAll(sock, data.substr(n));
  return absl::OkStatus();
}

absl::StatusOr<Received> RecvWithFds(int sock, size_t max_bytes) {
  Received out;
  out.data.resize(max_bytes);
  iovec iov{out.data.data(), max_bytes};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFdsPerMessage)];
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  ssize_t n;
  do {
    n = ::recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
  } while (n < 0 && errno == EINTR);
  if (n < 0) return ErrnoStatus(errno, "recvmsg");
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
      size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < count; ++i) {
        int fd;
        std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
        out.fds.emplace_back(fd);
      }
    }
  }
  if (msg.msg_flags & MSG_CTRUNC) {
    return absl::ResourceExhaustedError("recvmsg: descriptors truncated (too many in one message)");
  }
  if (n == 0) return absl::UnavailableError("recvmsg: peer closed the connection");
  out.data.resize(n);
  return out;
}

absl::StatusOr<std::string> ReadLine(int sock, size_t max_bytes) {
  std::string line;
  while (line.size() < max_bytes) {
    char c;
    ssize_t n = ::read(sock, &c, 1);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoStatus(errno, "read");
    if (n == 0) return absl::UnavailableError("peer closed the connection before a full line");
    if (c == '\n') return line;
    line.push_back(c);
  }
  return absl::InvalidArgumentError(absl::StrCat("line longer than ", max_bytes, " bytes"));
}

absl::Status WriteAll(int sock, const std::string& data) {
  size_t off = 0;
  while (off < data.size()) {
    ssize_t n = ::send(sock, data.data() + off, data.size() - off, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoStatus(errno, "send");
    off += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

uint64_t SocketInode(int fd) {
  struct stat st {};
  return fd >= 0 && ::fstat(fd, &st) == 0 && S_ISSOCK(st.st_mode) ? st.st_ino : 0;
}

}  // namespace weightcache
