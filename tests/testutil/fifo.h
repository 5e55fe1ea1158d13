// A FIFO for tests that check that nothing blocks on one (a FIFO where a config.json or a
// shard is expected). If the code under test does block in open() or read() on it, the
// guard's watchdog opens the writing end after `timeout` and closes it again, so the blocked
// reader sees end of file and the test fails on its assertions (and on fired()) instead of
// hanging until ctest's timeout.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

namespace weightcache::testing {

class FifoGuard {
 public:
  explicit FifoGuard(std::string path, std::chrono::seconds timeout = std::chrono::seconds(5))
      : path_(std::move(path)) {
    made_ = ::mkfifo(path_.c_str(), 0600) == 0;
    watchdog_ = std::thread([this, timeout] {
      std::unique_lock<std::mutex> l(mu_);
      if (cv_.wait_for(l, timeout, [this] { return done_; })) return;
      fired_ = true;
      const int fd = ::open(path_.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
      if (fd >= 0) ::close(fd);
    });
  }
  ~FifoGuard() {
    {
      std::lock_guard<std::mutex> l(mu_);
      done_ = true;
    }
    cv_.notify_all();
    watchdog_.join();
  }
  FifoGuard(const FifoGuard&) = delete;
  FifoGuard& operator=(const FifoGuard&) = delete;

  // mkfifo succeeded.
  bool made() const { return made_; }
  // The watchdog had to unblock a reader: the code under test blocked on the FIFO.
  bool fired() {
    std::lock_guard<std::mutex> l(mu_);
    return fired_;
  }

 private:
  const std::string path_;
  bool made_ = false;
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  bool fired_ = false;
  std::thread watchdog_;
};

}  // namespace weightcache::testing
