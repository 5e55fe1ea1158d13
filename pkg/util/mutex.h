// Mutex, MutexLock, CondVar: std::mutex and std::condition_variable with clang's
// thread-safety annotations, so that ABSL_GUARDED_BY(mu_) is checked at compile time
// (libstdc++'s std::mutex carries no annotation: clang cannot check state it guards).
// std primitives underneath, not absl::Mutex: ThreadSanitizer understands pthread mutexes,
// while Debian's abseil is not built with TSan and would report false races.
//
//   Mutex mu_;
//   int n_ ABSL_GUARDED_BY(mu_);
//   { MutexLock l(mu_); ++n_; cv_.NotifyAll(); }
//   { MutexLock l(mu_); while (n_ == 0) cv_.Wait(mu_); }
//
// Thread-safety: that is their job. Lifetime: a Mutex outlives every lock and wait on it.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>

#include "absl/base/thread_annotations.h"

namespace weightcache {

class ABSL_LOCKABLE Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mu_.lock(); }
  void Unlock() ABSL_UNLOCK_FUNCTION() { mu_.unlock(); }
  // Tells the analysis that the caller holds the lock (where it cannot see it).
  void AssertHeld() const ABSL_ASSERT_EXCLUSIVE_LOCK() {}

 private:
  friend class CondVar;
  std::mutex mu_;
};

// Holds `mu` for its scope.
class ABSL_SCOPED_LOCKABLE MutexLock {
 public:
  explicit MutexLock(Mutex& mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) { mu_.Lock(); }
  ~MutexLock() ABSL_UNLOCK_FUNCTION() { mu_.Unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex& mu_;
};

// A condition variable waited on with a held Mutex; waits may wake spuriously (loop on the
// condition).
class CondVar {
 public:
  void Wait(Mutex& mu) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    std::unique_lock<std::mutex> l(mu.mu_, std::adopt_lock);
    cv_.wait(l);
    l.release();  // still held: the caller's lock owns it
  }
  // false when `deadline` passed.
  bool WaitUntil(Mutex& mu, std::chrono::steady_clock::time_point deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    std::unique_lock<std::mutex> l(mu.mu_, std::adopt_lock);
    const bool woken = cv_.wait_until(l, deadline) == std::cv_status::no_timeout;
    l.release();
    return woken;
  }
  void NotifyOne() { cv_.notify_one(); }
  void NotifyAll() { cv_.notify_all(); }

 private:
  std::condition_variable cv_;
};

}  // namespace weightcache
