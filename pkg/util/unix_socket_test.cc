// RemoveStaleSocket: what sits where the daemon's socket belongs. An engine that could write
// the socket directory left a regular file there so the daemon would refuse to start at its
// next rollout (issue 25): what this uid owns is replaced, anything else is refused by name.
#include "pkg/util/unix_socket.h"

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testutil/temp_dir.h"

namespace weightcache {
namespace {

using ::testing::HasSubstr;

TEST(RemoveStaleSocketTest, AFileOfThisUidWhereTheSocketBelongsIsReplaced) {
  testing::TempDir dir;
  const std::string path = dir / "control.sock";
  std::ofstream(path) << "not a socket";
  ASSERT_TRUE(RemoveStaleSocket(path).ok());
  EXPECT_FALSE(std::filesystem::exists(path));
  // And then the daemon listens there.
  EXPECT_TRUE(ListenUnix(path, 0660, 8).ok());
}

TEST(RemoveStaleSocketTest, ASymlinkIsRemovedNotItsTarget) {
  testing::TempDir dir;
  std::ofstream(dir / "target") << "keep";
  std::filesystem::create_symlink(dir / "target", dir / "control.sock");
  ASSERT_TRUE(RemoveStaleSocket(dir / "control.sock").ok());
  EXPECT_FALSE(std::filesystem::is_symlink(dir / "control.sock"));
  EXPECT_TRUE(std::filesystem::exists(dir / "target"));
}

TEST(RemoveStaleSocketTest, ADirectoryOrAnotherUidsFileIsRefusedByName) {
  testing::TempDir dir;
  std::filesystem::create_directory(dir / "control.sock");
  absl::Status s = RemoveStaleSocket(dir / "control.sock");
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(s.message()), HasSubstr("is a directory owned by uid"));
  EXPECT_TRUE(std::filesystem::is_directory(dir / "control.sock"));
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to give a file to uid 65534";
  std::ofstream(dir / "handle.sock") << "x";
  ASSERT_EQ(::chown((dir / "handle.sock").c_str(), 65534, 65534), 0);
  s = RemoveStaleSocket(dir / "handle.sock");
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("is a regular file owned by uid 65534, not a socket; refusing"));
  EXPECT_TRUE(std::filesystem::exists(dir / "handle.sock"));
}

TEST(RemoveStaleSocketTest, ALiveServerIsLeftAlone) {
  testing::TempDir dir;
  auto live = ListenUnix(dir / "control.sock", 0660, 8);
  ASSERT_TRUE(live.ok());
  EXPECT_EQ(RemoveStaleSocket(dir / "control.sock").code(), absl::StatusCode::kAlreadyExists);
  // A dead one (no listener behind the inode) is removed.
  live->reset();
  EXPECT_TRUE(RemoveStaleSocket(dir / "control.sock").ok());
  EXPECT_FALSE(std::filesystem::exists(dir / "control.sock"));
}

}  // namespace
}  // namespace weightcache
