// Unix-domain socket helpers shared by the daemon, the client and the keeper: listening
// and connecting sockets, peer credentials, and passing descriptors with SCM_RIGHTS.
// Thread-safety: free functions on descriptors the caller owns.
#pragma once

#include <sys/socket.h>
#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "pkg/util/scoped_fd.h"

namespace weightcache {

// Most descriptors one message carries (the kernel's SCM_MAX_FD is 253).
inline constexpr size_t kMaxFdsPerMessage = 64;

// Creates `dir` (and parents) if missing with `mode`, then checks it is a real directory
// (not a symlink) owned by this user and tightens its mode to `mode`.
absl::Status PrepareSocketDir(const std::string& dir, mode_t mode);

// Gives `path` (a socket or its directory) group `gid`, so that processes of that group reach
// it; the error names the path and the group.
absl::Status ChangeGroup(const std::string& path, int gid);

// Removes a stale socket file at `path`, or a file that is not a socket (a regular file, a
// FIFO, a symlink: what an engine with write access could have put there to keep the daemon
// from starting) when this process's uid owns it; refuses (FAILED_PRECONDITION naming the
// type and owner) a directory or a non-socket of another uid, and a socket a live server
// still answers on (ALREADY_EXISTS). `type` is the socket
// type the server would listen with (a live SOCK_SEQPACKET server refuses a stream connect).
absl::Status RemoveStaleSocket(const std::string& path, int type = SOCK_STREAM);

// A listening socket of `type` (SOCK_STREAM, or SOCK_SEQPACKET for the keeper, whose
// messages keep their boundaries) bound at `path` (which must not exist), chmod'ed to `mode`.
absl::StatusOr<ScopedFd> ListenUnix(const std::string& path, mode_t mode, int backlog = 128,
                                    int type = SOCK_STREAM);
absl::StatusOr<ScopedFd> ConnectUnix(const std::string& path, int type = SOCK_STREAM);
// As ConnectUnix, without waiting for room in the listener's backlog: UNAVAILABLE at once
// when it is full (a server that stopped accepting, e.g. frozen). The socket it returns
// blocks.
absl::StatusOr<ScopedFd> ConnectUnixNoWait(const std::string& path, int type = SOCK_STREAM);
// The inode of the socket `fd` names now; 0 when it is closed or not a socket. A descriptor
// number taken again by another socket gives another inode, so tables keyed by descriptor
// numbers record it to tell their connection from a newcomer.
uint64_t SocketInode(int fd);

struct PeerCred {
  pid_t pid = 0;
  uid_t uid = 0;
  gid_t gid = 0;
};
absl::StatusOr<PeerCred> GetPeerCred(int fd);

// Sends `data` and up to kMaxFdsPerMessage descriptors in one message.
absl::Status SendWithFds(int sock, const std::string& data, const std::vector<int>& fds);
// Receives one message of at most `max_bytes` and the descriptors that came with it
// (close-on-exec). An orderly EOF gives UNAVAILABLE.
struct Received {
  std::string data;
  std::vector<ScopedFd> fds;
};
absl::StatusOr<Received> RecvWithFds(int sock, size_t max_bytes);

// Reads a line ending in '\n' of at most `max_bytes` (byte by byte: for short handshakes).
absl::StatusOr<std::string> ReadLine(int sock, size_t max_bytes);
absl::Status WriteAll(int sock, const std::string& data);

}  // namespace weightcache
