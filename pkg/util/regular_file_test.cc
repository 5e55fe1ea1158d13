#include "pkg/util/regular_file.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>

#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testutil/temp_dir.h"

namespace weightcache {
namespace {

using ::testing::HasSubstr;

TEST(OpenRegularFileTest, OpensARegularFile) {
  testing::TempDir dir;
  std::ofstream(dir / "f") << "hello";
  auto f = OpenRegularFile(dir / "f");
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_TRUE(f->fd.valid());
  EXPECT_EQ(f->size, 5u);
}

TEST(OpenRegularFileTest, MissingFileIsNotFound) {
  testing::TempDir dir;
  auto f = OpenRegularFile(dir / "nope");
  EXPECT_EQ(f.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(f.status().message()), HasSubstr("open " + dir / "nope"));
}

// A FIFO with no writer: a plain open() would block forever.
TEST(OpenRegularFileTest, FifoFailsAtOnceNamingIt) {
  testing::TempDir dir;
  ASSERT_EQ(::mkfifo((dir / "config.json").c_str(), 0600), 0);
  auto f = OpenRegularFile(dir / "config.json");
  EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(f.status().message()),
            dir / "config.json" + ": is a FIFO, not a regular file");
}

TEST(OpenRegularFileTest, DirectoryDeviceAndSocketAreNamed) {
  testing::TempDir dir;
  auto d = OpenRegularFile(dir.path());
  EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(d.status().message()), HasSubstr("is a directory, not a regular file"));
  auto dev = OpenRegularFile("/dev/null");
  EXPECT_THAT(std::string(dev.status().message()),
              HasSubstr("/dev/null: is a character device, not a regular file"));

  const std::string sock_path = dir / "s";
  const int s = ::socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_GE(s, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  sock_path.copy(addr.sun_path, sizeof(addr.sun_path) - 1);
  ASSERT_EQ(::bind(s, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  auto sock = OpenRegularFile(sock_path);
  ::close(s);
  EXPECT_EQ(sock.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(sock.status().message()), HasSubstr("is a socket, not a regular file"));
}

}  // namespace
}  // namespace weightcache
