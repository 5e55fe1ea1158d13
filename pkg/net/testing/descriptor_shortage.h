// Test helper: takes every free descriptor below a low open-file limit, so that accept(2) and
// socket(2) in the code under test fail with EMFILE. The limit is restored, and the
// descriptors given back, by Release or the destructor. Tests only.
#pragma once

#include <fcntl.h>
#include <sys/resource.h>

#include <vector>

#include "pkg/util/scoped_fd.h"

namespace weightcache::testing {

class DescriptorShortage {
 public:
  explicit DescriptorShortage(rlim_t limit) {
    ::getrlimit(RLIMIT_NOFILE, &before_);
    rlimit low = before_;
    low.rlim_cur = limit;
    ok_ = ::setrlimit(RLIMIT_NOFILE, &low) == 0;
    while (ok_) {
      ScopedFd f(::fcntl(0, F_DUPFD_CLOEXEC, 0));
      if (!f) break;
      fillers_.push_back(std::move(f));
    }
  }
  ~DescriptorShortage() { Release(); }
  DescriptorShortage(const DescriptorShortage&) = delete;
  DescriptorShortage& operator=(const DescriptorShortage&) = delete;
  bool ok() const { return ok_; }
  // Gives `n` descriptors back: exactly that many are free.
  void Free(size_t n) {
    for (size_t i = 0; i < n && !fillers_.empty(); ++i) fillers_.pop_back();
  }
  void Release() {
    fillers_.clear();
    if (ok_) ::setrlimit(RLIMIT_NOFILE, &before_);
    ok_ = false;
  }

 private:
  rlimit before_{};
  bool ok_ = false;
  std::vector<ScopedFd> fillers_;
};

}  // namespace weightcache::testing
