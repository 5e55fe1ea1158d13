#include "pkg/util/rlimit.h"

#include <sys/resource.h>

#include "pkg/util/log.h"

namespace weightcache {

uint64_t RaiseOpenFileLimit() {
  struct rlimit rl {};
  if (::getrlimit(RLIMIT_NOFILE, &rl) != 0) return 0;
  const rlim_t before = rl.rlim_cur;
  if (rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    if (::setrlimit(RLIMIT_NOFILE, &rl) != 0) rl.rlim_cur = before;
  }
  WC_LOG_INFO("open-file limit %d (was %d, hard %d)", static_cast<long long>(rl.rlim_cur),
              static_cast<long long>(before), static_cast<long long>(rl.rlim_max));
  return rl.rlim_cur;
}

}  // namespace weightcache
