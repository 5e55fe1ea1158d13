// epoll_wait for a loop the daemon cannot do without (the control relay, the peer port):
// leaving such a loop would leave its connections unserved while the daemon looks alive
// (issue 26). EINTR reads as no events; any other error (never expected: EBADF, EFAULT and
// EINVAL are bugs) is logged and retried after 100 ms, and after 50 in a row the process
// aborts so that it is restarted (the keeper keeps the cache).
//
// Thread-safety: one EpollWaiter per loop thread.
#pragma once

#include <sys/epoll.h>

#include <string>

#include "absl/status/statusor.h"
#include "pkg/util/scoped_fd.h"

namespace weightcache {

class EpollWaiter {
 public:
  // `who` names the loop in logs ("control relay", "peer port").
  explicit EpollWaiter(std::string who) : who_(std::move(who)) {}
  // The events ready (0 on EINTR or after a logged, retried error).
  int Wait(int epoll_fd, epoll_event* events, int max_events, int timeout_ms);

 private:
  const std::string who_;
  int failures_ = 0;  // errors in a row
};

// An epoll instance and an eventfd registered in it for reading with `wake_data`: the pair
// every loop uses to be woken from other threads (write 1 to `wake`).
struct EpollWithWake {
  ScopedFd epoll;
  ScopedFd wake;
};
absl::StatusOr<EpollWithWake> MakeEpollWithWake(uint64_t wake_data);

}  // namespace weightcache
