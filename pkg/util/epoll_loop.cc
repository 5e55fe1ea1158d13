#include "pkg/util/epoll_loop.h"

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "pkg/util/log.h"

namespace weightcache {

int EpollWaiter::Wait(int epoll_fd, epoll_event* events, int max_events, int timeout_ms) {
  const int n = ::epoll_wait(epoll_fd, events, max_events, timeout_ms);
  if (n >= 0) {
    failures_ = 0;
    return n;
  }
  const int err = errno;
  if (err == EINTR) return 0;
  WC_LOG_ERROR("%s: epoll_wait: %s (%d in a row)", who_, std::strerror(err), ++failures_);
  if (failures_ >= 50) {
    WC_LOG_ERROR("%s: epoll_wait keeps failing; aborting so the daemon restarts", who_);
    std::abort();
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  return 0;
}

}  // namespace weightcache
