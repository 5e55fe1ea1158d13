#include "pkg/net/activity.h"

#include <sys/socket.h>

namespace weightcache::net {
namespace {

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             Activity::Clock::now().time_since_epoch())
      .count();
}

}  // namespace

Activity::Activity(int fd) : fd_(fd), last_ns_(NowNs()) {}

void Activity::Touch() { last_ns_.store(NowNs(), std::memory_order_relaxed); }

void Activity::SetBusy(bool busy) {
  if (busy_.exchange(busy, std::memory_order_relaxed) != busy && !busy) Touch();
}

void Activity::Closing() {
  MutexLock l(mu_);
  fd_ = -1;
}

bool Activity::closed() const {
  MutexLock l(mu_);
  return fd_ < 0;
}

bool Activity::ShutDownIfIdle(Clock::time_point now, Clock::duration idle) {
  if (busy_.load(std::memory_order_relaxed)) return false;
  const int64_t since =
      std::chrono::duration_cast<std::chrono::nanoseconds>(now.time_since_epoch()).count() -
      last_ns_.load(std::memory_order_relaxed);
  if (since < std::chrono::duration_cast<std::chrono::nanoseconds>(idle).count()) return false;
  MutexLock l(mu_);
  if (fd_ < 0) return false;
  // The peer sees the end; the listener's loop sees it too and closes the descriptor.
  (void)::shutdown(fd_, SHUT_RDWR);
  fd_ = -1;
  return true;
}

}  // namespace weightcache::net
