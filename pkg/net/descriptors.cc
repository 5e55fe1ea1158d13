#include "pkg/net/descriptors.h"

#include <fcntl.h>

#include <cerrno>
#include <vector>

#include "pkg/util/scoped_fd.h"

namespace weightcache::net {

bool IsOutOfDescriptors(int err) {
  return err == EMFILE || err == ENFILE || err == ENOBUFS || err == ENOMEM;
}

int DescriptorHeadroom(int any_fd, int n) {
  std::vector<ScopedFd> probes;
  probes.reserve(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    ScopedFd p(::fcntl(any_fd, F_DUPFD_CLOEXEC, 0));
    if (!p) return errno;
    probes.push_back(std::move(p));
  }
  return 0;
}

}  // namespace weightcache::net
