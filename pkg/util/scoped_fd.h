// ScopedFd: the one owner of a POSIX file descriptor. Move-only; the empty state (-1) is
// valid. Not thread-safe: one owner at a time, as with any value type.
#pragma once

#include <unistd.h>

#include <utility>

#include "absl/status/statusor.h"

namespace weightcache {

class ScopedFd {
 public:
  ScopedFd() = default;
  explicit ScopedFd(int fd) : fd_(fd) {}
  ScopedFd(const ScopedFd&) = delete;
  ScopedFd& operator=(const ScopedFd&) = delete;
  ScopedFd(ScopedFd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  ScopedFd& operator=(ScopedFd&& o) noexcept {
    if (this != &o) reset(std::exchange(o.fd_, -1));
    return *this;
  }
  ~ScopedFd() { reset(); }

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  explicit operator bool() const { return valid(); }
  int release() { return std::exchange(fd_, -1); }
  void reset(int fd = -1) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }
  // A new owner of a dup() of this descriptor (close-on-exec).
  absl::StatusOr<ScopedFd> Dup() const;

 private:
  int fd_ = -1;
};

}  // namespace weightcache
