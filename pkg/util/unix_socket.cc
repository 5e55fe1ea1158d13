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
#include "absl/strings/str_format.h"
#include "pkg/util/errno_status.h"
#include "pkg/util/log.h"
#include "pkg/util/status_macros.h"

namespace weightcache {
namespace {

// The address of `path`. A path longer than sun_path holds is reached through its directory,
// opened into `*dir` (O_PATH): "/proc/self/fd/<dir>/<name>", which bind(2) and connect(2)
// resolve to the same file (the kubelet's volume directories alone are longer than 107 bytes).
absl::StatusOr<sockaddr_un> Address(const std::string& path, ScopedFd* dir) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  const size_t slash = path.rfind('/');
  if (dir != nullptr && path.size() >= sizeof(addr.sun_path) && slash != std::string::npos &&
      slash > 0 && path.size() - slash < sizeof(addr.sun_path) - 32) {
    const std::string parent = path.substr(0, slash);
    *dir = ScopedFd(::open(parent.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
    if (!*dir) return ErrnoStatus(errno, "open the socket's directory", parent);
    const std::string via = absl::StrCat("/proc/self/fd/", dir->get(), path.substr(slash));
    std::memcpy(addr.sun_path, via.c_str(), via.size() + 1);
    return addr;
  }
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

namespace {

std::string Octal(mode_t mode) { return absl::StrFormat("%04o", mode & 07777); }

const char* TypeName(mode_t mode) {
  return S_ISREG(mode)    ? "a regular file"
         : S_ISDIR(mode)  ? "a directory"
         : S_ISLNK(mode)  ? "a symlink"
         : S_ISFIFO(mode) ? "a FIFO"
         : S_ISSOCK(mode) ? "a socket"
         : S_ISCHR(mode)  ? "a character device"
         : S_ISBLK(mode)  ? "a block device"
                          : "something that is not a socket";
}

// Whether an existing `dir` (lstat'ed as `st`) may hold our sockets as it is
// (unix_socket.h, PrepareSocketDir). Never changes it.
absl::Status CheckExistingSocketDir(const std::string& dir, const struct stat& st, int gid) {
  const std::string found = absl::StrCat(" (mode ", Octal(st.st_mode), ", owner uid ", st.st_uid,
                                         " gid ", st.st_gid, ")");
  if (!S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat(dir, ": ", TypeName(st.st_mode),
                                                      " is there, not a directory", found,
                                                      "; remove it or name another path"));
  }
  if (st.st_uid != ::geteuid() && st.st_uid != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "directory ", dir, found, " belongs to another user (this process is uid ", ::geteuid(),
        "), who could replace the sockets in it; name a directory of this uid or root"));
  }
  if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0 && (st.st_mode & S_ISVTX) == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "directory ", dir, found,
        " is writable by its group or others without the sticky bit: they could replace the "
        "sockets in it; name a directory only its owner can write (e.g. 0755, or 1777 like "
        "/tmp), or one that does not exist yet (it is then created)"));
  }
  const bool group_search = static_cast<int>(st.st_gid) == gid && (st.st_mode & S_IXGRP) != 0;
  if (gid >= 0 && (st.st_mode & S_IXOTH) == 0 && !group_search) {
    return absl::FailedPreconditionError(absl::StrCat(
        "directory ", dir, found, " is not searchable by group ", gid,
        " (--socket_gid), so engines of that group could not reach the sockets; give it group ",
        gid, " with g+x (or o+x), or name a directory that does not exist yet"));
  }
  return absl::OkStatus();
}

// Creates the last component of `dir` (its parent exists) with exactly `mode` and group
// `gid`. False when something is already there (EEXIST): the caller checks it as existing.
absl::StatusOr<bool> MakeSocketDir(const std::string& dir, mode_t mode, int gid) {
  if (::mkdir(dir.c_str(), mode) != 0) {
    if (errno == EEXIST) return false;
    return ErrnoStatus(errno, "mkdir (socket dir)", dir);
  }
  // What we just made: fchmod (the umask may have cleared bits of `mode`) and fchown it
  // through a descriptor, never following a symlink put in its place.
  ScopedFd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!fd) return ErrnoStatus(errno, "open (socket dir just created)", dir);
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return ErrnoStatus(errno, "fstat", dir);
  if (st.st_uid != ::geteuid()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "socket dir ", dir, " was replaced right after this process created it (now uid ",
        st.st_uid, "); refusing it"));
  }
  if (::fchmod(fd.get(), mode) != 0) return ErrnoStatus(errno, "fchmod", dir);
  if (gid >= 0 && ::fchown(fd.get(), static_cast<uid_t>(-1), static_cast<gid_t>(gid)) != 0) {
    return ErrnoStatus(errno, "chown to group " + std::to_string(gid), dir);
  }
  WC_LOG_INFO("created socket dir %s (mode %s%s)", dir, Octal(mode),
              gid >= 0 ? absl::StrCat(", group ", gid) : std::string());
  return true;
}

// 0 when a server accepts a connection at `path` now, else connect()'s errno. Never waits
// for room in a full backlog (EAGAIN).
int ProbeConnect(const sockaddr_un& addr, int type) {
  ScopedFd fd(::socket(AF_UNIX, type | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd) return errno;
  int rc;
  do {
    rc = ::connect(fd.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof(addr));
  } while (rc != 0 && errno == EINTR);
  return rc == 0 ? 0 : errno;
}

}  // namespace

absl::Status PrepareSocketDir(const std::string& dir, mode_t mode, int gid) {
  if (dir.empty()) return absl::InvalidArgumentError("socket dir: empty path");
  for (int attempt = 0; attempt < 2; ++attempt) {
    struct stat st;
    if (::lstat(dir.c_str(), &st) == 0) {
      WC_RETURN_IF_ERROR(CheckExistingSocketDir(dir, st, gid));
      WC_LOG_DEBUG("socket dir %s exists (mode %s, uid %d, gid %d): used as it is", dir,
                   Octal(st.st_mode), static_cast<long long>(st.st_uid),
                   static_cast<long long>(st.st_gid));
      return absl::OkStatus();
    }
    if (errno != ENOENT) return ErrnoStatus(errno, "lstat (socket dir)", dir);
    const std::filesystem::path parent = std::filesystem::path(dir).parent_path();
    std::error_code ec;
    if (!parent.empty()) std::filesystem::create_directories(parent, ec);
    if (ec) {
      return absl::PermissionDeniedError(
          absl::StrCat("create the parents of socket dir ", dir, ": ", ec.message()));
    }
    WC_ASSIGN_OR_RETURN(const bool created, MakeSocketDir(dir, mode, gid));
    if (created) return absl::OkStatus();
    // Another process made it between lstat and mkdir: check it as an existing one.
  }
  return absl::FailedPreconditionError(
      absl::StrCat("socket dir ", dir, " keeps appearing and vanishing; refusing it"));
}

absl::Status RemoveStaleSocket(const std::string& path, const StaleSocketCheck& check) {
  const std::string& label = check.label.empty() ? path : check.label;
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return absl::OkStatus();
    return ErrnoStatus(errno, "lstat", label);
  }
  if (!S_ISSOCK(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat(label, ": ", TypeName(st.st_mode), " is there (not a socket; owner uid ",
                     st.st_uid, "); remove it or name another path"));
  }
  ScopedFd dir;
  WC_ASSIGN_OR_RETURN(const sockaddr_un addr, Address(path, &dir));
  const int err = ProbeConnect(addr, check.type);
  if (err == 0 || err == EAGAIN) {
    return absl::AlreadyExistsError(absl::StrCat(label, ": another ", check.server, " listens on ",
                                                 path, err == 0 ? "" : " (its backlog is full)",
                                                 "; stop it or name another path"));
  }
  if (err != ECONNREFUSED) {
    const std::string why = err == EPROTOTYPE
                                ? std::string("a socket of another type is bound there")
                                : std::string(ErrnoStatus(err, "connect", path).message());
    return absl::FailedPreconditionError(absl::StrCat(label,
                                                      ": a socket is there that is not stale (",
                                                      why, "); remove it or name another path"));
  }
  // Stale: nobody listens. Only a socket is unlinked, and only after the probe said so.
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) return ErrnoStatus(errno, "unlink", label);
  WC_LOG_INFO("%s: removed a stale socket (nobody listened on it)", label);
  return absl::OkStatus();
}

absl::StatusOr<ScopedFd> ListenUnix(const std::string& path, mode_t mode, int backlog, int type) {
  ScopedFd dir;
  auto addr = Address(path, &dir);
  if (!addr.ok()) return addr.status();
  ScopedFd fd(::socket(AF_UNIX, type | SOCK_CLOEXEC, 0));
  if (!fd) return ErrnoStatus(errno, "socket");
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&*addr), sizeof(*addr)) != 0) {
    return ErrnoStatus(errno, "bind", path);
  }
  // The socket this call just bound: in a directory PrepareSocketDir accepted, nobody else
  // can have put something else at `path` since.
  if (::chmod(path.c_str(), mode) != 0) return ErrnoStatus(errno, "chmod", path);
  if (::listen(fd.get(), backlog) != 0) return ErrnoStatus(errno, "listen", path);
  return fd;
}

absl::StatusOr<ScopedFd> ConnectUnix(const std::string& path, int type) {
  ScopedFd dir;
  auto addr = Address(path, &dir);
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
  ScopedFd dir;
  auto addr = Address(path, &dir);
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
