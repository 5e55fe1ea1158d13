// Activity: when a connection the acceptor handed over last moved a byte, and whether it has
// work in flight; with it the acceptor closes connections idle past the listener's `idle`
// (acceptor.h), so the idle timeout is kept in one place, like the caps and the deadlines.
//
// The listener touches it as bytes move (Splice does, given one), marks it busy while work is
// in flight (an open HTTP/2 stream, a request being read or answered: a busy connection is
// never idle, however long the work waits), and owns it through an ActivityHandle, which it
// keeps beside the connection's descriptor and destroys before closing that descriptor: the
// acceptor shuts an idle connection down (shutdown(2), never close(2)) under the same lock, so
// it never touches a descriptor number the listener has closed and another socket reuses. The
// listener then sees the end of the connection in its own loop and closes it as it closes any.
//
// Thread-safety: every method from any thread. Lifetimes: shared by the handle (the
// listener's) and the acceptor's watch list; the acceptor forgets it once closed.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "pkg/util/mutex.h"

namespace weightcache::net {

class Activity {
 public:
  using Clock = std::chrono::steady_clock;
  explicit Activity(int fd);
  Activity(const Activity&) = delete;
  Activity& operator=(const Activity&) = delete;

  // Bytes moved (either way): the idle time starts again.
  void Touch();
  // Work in flight (true) or none (false): a busy connection is never closed as idle; when the
  // work ends the idle time starts again.
  void SetBusy(bool busy);
  // The listener is about to close the descriptor: the acceptor lets it be from now on.
  void Closing();

  // The acceptor's: shuts the connection down when it is open, not busy, and nothing moved
  // for `idle` before `now`. True when it did (once: the connection counts as closed then).
  bool ShutDownIfIdle(Clock::time_point now, Clock::duration idle);
  bool closed() const;

 private:
  mutable Mutex mu_;
  int fd_ ABSL_GUARDED_BY(mu_);  // -1 once closing or shut down
  std::atomic<int64_t> last_ns_;
  std::atomic<bool> busy_{false};
};

// The listener's hold on a connection's Activity: move-only; destroying (or Reset) it marks
// the connection closing. Keep it next to the descriptor and declared after it, so that it
// goes first when both go together.
class ActivityHandle {
 public:
  ActivityHandle() = default;
  explicit ActivityHandle(std::shared_ptr<Activity> a) : a_(std::move(a)) {}
  ActivityHandle(ActivityHandle&&) noexcept = default;
  ActivityHandle& operator=(ActivityHandle&& o) noexcept {
    if (this != &o) {
      Reset();
      a_ = std::move(o.a_);
    }
    return *this;
  }
  ActivityHandle(const ActivityHandle&) = delete;
  ActivityHandle& operator=(const ActivityHandle&) = delete;
  ~ActivityHandle() { Reset(); }

  // No-ops without an Activity (the listener has no idle timeout).
  void Touch() const {
    if (a_) a_->Touch();
  }
  void SetBusy(bool busy) const {
    if (a_) a_->SetBusy(busy);
  }
  void Reset() {
    if (a_) a_->Closing();
    a_.reset();
  }
  Activity* get() const { return a_.get(); }

 private:
  std::shared_ptr<Activity> a_;
};

}  // namespace weightcache::net
