#include "pkg/util/epoll_loop.h"

#include <sys/eventfd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "pkg/util/errno_status.h"
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

absl::StatusOr<EpollWithWake> MakeEpollWithWake(uint64_t wake_data) {
  EpollWithWake e;
  e.epoll.reset(::epoll_create1(EPOLL_CLOEXEC));
  if (!e.epoll) return ErrnoStatus(errno, "epoll_create1");
  e.wake.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!e.wake) return ErrnoStatus(errno, "eventfd");
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = wake_data;
  if (::epoll_ctl(e.epoll.get(), EPOLL_CTL_ADD, e.wake.get(), &ev) != 0) {
    return ErrnoStatus(errno, "epoll_ctl");
  }
  return e;
}

}  // namespace weightcache
