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

// Makes `dir` ready to hold this process's listening sockets without changing anything it
// did not create (issue 47):
//  - missing: creates it (missing parents with the default mode), the last component with
//    exactly `mode` and, when `gid` >= 0, group `gid`;
//  - present: uses it as it is when it is acceptable, and refuses it (FAILED_PRECONDITION
//    naming the directory, what was found and what to do) otherwise; its mode and owner are
//    never changed. Acceptable (docs/security.md, "Paths"): a directory, not a symlink;
//    owned by this process's uid or by root; not writable by group or others unless the
//    sticky bit is set (then nobody but a file's owner, the directory's owner and root may
//    remove or rename what is in it, so nobody else can replace the sockets); and when
//    `gid` >= 0, searchable by that group (o+x, or group `gid` with g+x), so that the
//    engines given that group reach the sockets.
// Only `dir` itself is checked: its parents are the operator's.
absl::Status PrepareSocketDir(const std::string& dir, mode_t mode, int gid = -1);

// Gives `path` (a socket this process bound, or a directory it created) group `gid`, so that
// processes of that group reach it; the error names the path and the group.
absl::Status ChangeGroup(const std::string& path, int gid);

// How RemoveStaleSocket checks and names the path.
struct StaleSocketCheck {
  // The socket type the server would listen with: a live server of another type refuses a
  // connect with EPROTOTYPE, which is refused here too.
  int type = SOCK_STREAM;
  // How errors name the path (e.g. "--socket=/run/k/keeper.sock"); empty: the path.
  std::string label;
  // Who would be listening there, for the error (e.g. "keeper").
  std::string server = "server";
};

// Makes room for a listener at `path`: nothing there is fine; a stale socket (a socket file
// nobody listens on: connect() gets ECONNREFUSED) is unlinked; anything else is left where
// it is and refused by name: a live socket (ALREADY_EXISTS, "another keeper listens on
// ..."), a regular file, FIFO, symlink or directory (FAILED_PRECONDITION, "a regular file
// is there (not a socket); remove it or name another path"), or a socket whose connect
// fails otherwise (a full backlog, a socket of another type, no permission).
absl::Status RemoveStaleSocket(const std::string& path, const StaleSocketCheck& check = {});

// A listening socket of `type` (SOCK_STREAM, or SOCK_SEQPACKET for the keeper, whose
// messages keep their boundaries) bound at `path` (which must not exist), chmod'ed to `mode`.
// Here and in the Connect calls a path longer than sockaddr_un holds (107 bytes; a kubelet
// volume's directory is longer) is reached through its directory (/proc/self/fd/N/name);
// only the file name must be short.
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
