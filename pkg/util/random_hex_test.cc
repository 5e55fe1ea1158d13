#include <sys/resource.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "pkg/util/bytes.h"
#include "pkg/util/scoped_fd.h"

namespace weightcache {
namespace {

// Lease ids and tokens. Finding (issue 26): RandomHex opened /dev/urandom and aborted the daemon
// when the open failed, which it does with EMFILE exactly when a connection flood has used up the
// descriptors. It now asks getrandom(2), which needs none.
TEST(RandomHex, WorksWithEveryDescriptorInUse) {
  struct rlimit old {};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &old), 0);
  struct rlimit low = old;
  low.rlim_cur = 64;
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &low), 0);
  std::vector<ScopedFd> used;
  while (true) {
    ScopedFd fd(::dup(STDERR_FILENO));
    if (!fd.valid()) break;
    used.push_back(std::move(fd));
  }
  ASSERT_EQ(errno, EMFILE);
  const std::string a = RandomHex(16), b = RandomHex(16);
  used.clear();
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &old), 0);
  EXPECT_EQ(a.size(), 32u);
  EXPECT_EQ(a.find_first_not_of("0123456789abcdef"), std::string::npos) << a;
  EXPECT_NE(a, b);
}

}  // namespace
}  // namespace weightcache
