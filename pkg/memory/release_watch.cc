#include "pkg/memory/internal/release_watch.h"

#include <sys/inotify.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "pkg/util/log.h"

namespace weightcache::memory {

ReleaseWatch::ReleaseWatch() {
  MutexLock l(mu_);
  inotify_ = ScopedFd(::inotify_init1(IN_NONBLOCK | IN_CLOEXEC));
  if (!inotify_) {
    WC_LOG_WARN(
        "inotify_init1: %s; memory of evicted segments that clients still hold stays counted "
        "against the budget until the daemon exits",
        std::strerror(errno));
  }
}

void ReleaseWatch::Track(int fd, const std::string& device, uint64_t bytes,
                         const std::string& label) {
  MutexLock l(mu_);
  DrainLocked();  // a watch descriptor freed by an unread IN_IGNORED is not mistaken
  int wd = -1;
  if (inotify_) {
    const std::string self = absl::StrCat("/proc/self/fd/", fd);
    wd = ::inotify_add_watch(inotify_.get(), self.c_str(), IN_DELETE_SELF);
  }
  if (wd < 0) {
    WC_LOG_WARN(
        "%s: cannot watch for its release (%s); its %d bytes on %s stay counted against the "
        "budget until the daemon exits",
        label, inotify_ ? std::strerror(errno) : "no inotify", bytes, device);
    unseen_[device] += bytes;
    return;
  }
  watched_[wd] = {device, bytes, label};
}

uint64_t ReleaseWatch::Lingering(const std::string& device) {
  MutexLock l(mu_);
  DrainLocked();
  uint64_t n = 0;
  if (auto it = unseen_.find(device); it != unseen_.end()) n = it->second;
  for (const auto& [wd, d] : watched_) {
    if (d.device == device) n += d.bytes;
  }
  return n;
}

void ReleaseWatch::DrainLocked() {
  if (!inotify_) return;
  alignas(struct inotify_event) char buf[4096];
  while (true) {
    const ssize_t n = ::read(inotify_.get(), buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // EAGAIN: nothing more now
    for (ssize_t at = 0; at < n;) {
      const auto* ev = reinterpret_cast<const struct inotify_event*>(buf + at);
      at += static_cast<ssize_t>(sizeof(struct inotify_event) + ev->len);
      if ((ev->mask & IN_Q_OVERFLOW) != 0 && !overflowed_) {
        // Cannot happen with one event per segment below the queue's 16384; said if it does.
        overflowed_ = true;
        WC_LOG_WARN("inotify queue overflowed: some released segments stay counted");
      }
      if ((ev->mask & IN_IGNORED) == 0) continue;  // IN_DELETE_SELF comes just before
      auto it = watched_.find(ev->wd);
      if (it == watched_.end()) continue;
      WC_LOG_DEBUG("%s: released by its last holder (%d bytes on %s)", it->second.label,
                   it->second.bytes, it->second.device);
      watched_.erase(it);
    }
  }
}

}  // namespace weightcache::memory
