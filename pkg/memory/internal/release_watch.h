// When memory the daemon dropped is really gone (issue 25). A segment the daemon evicts may
// still be held by another process: an engine that ended its lease but kept the descriptors
// or a mapping (or opened the memfd again through /proc). Until the last of those goes the
// memory is in use, and the budget must count it, or one pod multiplies real use past the
// budget by evict-and-reload.
//
// Host segments are memfds: every descriptor, re-open and mapping of one shares its dentry,
// and when the last goes the kernel frees the inode. An inotify watch for IN_DELETE_SELF
// on the memfd (added through the daemon's own descriptor before it closes it) is answered
// with IN_IGNORED exactly then, and not before: nothing else a holder does (open, close,
// map) makes an event, so no holder can flood the queue. The watch does not keep the inode.
// Not a public header.
//
// Thread-safety: every method may be called from any thread. Lifetimes: outlives the
// segments that Track() into it (they hold a shared_ptr).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "pkg/util/mutex.h"
#include "pkg/util/scoped_fd.h"

namespace weightcache::memory {

class ReleaseWatch {
 public:
  ReleaseWatch();
  ReleaseWatch(const ReleaseWatch&) = delete;
  ReleaseWatch& operator=(const ReleaseWatch&) = delete;

  // The daemon is about to close `fd`, a memfd of `bytes` on `device` (`label` for the
  // log). Counted as lingering until the kernel says its last holder let go. When it cannot
  // be watched (inotify's limits), it is counted until the daemon exits, with a warning:
  // what cannot be seen to be free is not assumed free.
  void Track(int fd, const std::string& device, uint64_t bytes, const std::string& label);
  // Bytes on `device` dropped by the daemon and still held elsewhere, as of now.
  uint64_t Lingering(const std::string& device);

 private:
  void DrainLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  struct Dropped {
    std::string device;
    uint64_t bytes = 0;
    std::string label;
  };
  Mutex mu_;
  ScopedFd inotify_ ABSL_GUARDED_BY(mu_);
  std::map<int, Dropped> watched_ ABSL_GUARDED_BY(mu_);          // by watch descriptor
  std::map<std::string, uint64_t> unseen_ ABSL_GUARDED_BY(mu_);  // device -> bytes not watched
  bool overflowed_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace weightcache::memory
