// What sits where a listener's socket or its directory belongs (issues 25 and 47).
// RemoveStaleSocket unlinks a stale socket (nobody listens) and nothing else: a regular file,
// a FIFO, a symlink, a directory, a live socket are left where they are and refused by name.
// PrepareSocketDir creates a missing directory with the mode asked, and uses an existing one
// as it is when it is safe, refusing it otherwise: it never chmods or chowns what it finds.
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

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

struct stat Lstat(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(::lstat(path.c_str(), &st), 0) << path;
  return st;
}

// Before (issue 47): a regular file or a FIFO of this uid where the socket belongs was
// unlinked (as root, that is any root-owned file an operator named by mistake).
TEST(RemoveStaleSocketTest, ARegularFileOrAFifoIsRefusedByNameAndLeft) {
  testing::TempDir dir;
  const std::string file = dir / "control.sock";
  std::ofstream(file) << "not a socket";
  absl::Status s = RemoveStaleSocket(file, {.label = "--socket=" + file});
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("--socket=" + file + ": a regular file is there (not a socket"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("remove it or name another path"));
  EXPECT_EQ(ReadAll(file), "not a socket");

  const std::string fifo = dir / "handle.sock";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  s = RemoveStaleSocket(fifo);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(s.message()), HasSubstr(fifo + ": a FIFO is there (not a socket"));
  EXPECT_TRUE(S_ISFIFO(Lstat(fifo).st_mode));
}

// Before: a symlink there was unlinked.
TEST(RemoveStaleSocketTest, ASymlinkOrADirectoryIsRefusedAndLeft) {
  testing::TempDir dir;
  std::ofstream(dir / "target") << "keep";
  std::filesystem::create_symlink(dir / "target", dir / "control.sock");
  absl::Status s = RemoveStaleSocket(dir / "control.sock");
  EXPECT_THAT(std::string(s.message()), HasSubstr("a symlink is there (not a socket"));
  EXPECT_TRUE(std::filesystem::is_symlink(dir / "control.sock"));
  EXPECT_EQ(ReadAll(dir / "target"), "keep");
  std::filesystem::create_directory(dir / "handle.sock");
  s = RemoveStaleSocket(dir / "handle.sock");
  EXPECT_THAT(std::string(s.message()), HasSubstr("a directory is there (not a socket"));
  EXPECT_TRUE(std::filesystem::is_directory(dir / "handle.sock"));
}

TEST(RemoveStaleSocketTest, ALiveServerIsLeftAloneAndAStaleSocketIsReplaced) {
  testing::TempDir dir;
  const std::string path = dir / "control.sock";
  auto live = ListenUnix(path, 0660, 8);
  ASSERT_TRUE(live.ok());
  const ino_t ino = Lstat(path).st_ino;
  absl::Status s = RemoveStaleSocket(path, {.server = "keeper"});
  EXPECT_EQ(s.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(std::string(s.message()), HasSubstr("another keeper listens on " + path));
  EXPECT_EQ(Lstat(path).st_ino, ino);
  EXPECT_TRUE(ConnectUnix(path).ok());
  // A dead one (no listener behind the inode: connect() gets ECONNREFUSED) is removed, and
  // a listener takes its place (the restart case).
  live->reset();
  EXPECT_TRUE(RemoveStaleSocket(path).ok());
  EXPECT_FALSE(std::filesystem::exists(path));
  EXPECT_TRUE(ListenUnix(path, 0660, 8).ok());
}

TEST(RemoveStaleSocketTest, ALiveSocketOfAnotherTypeIsNotTakenForStale) {
  testing::TempDir dir;
  const std::string path = dir / "keeper.sock";
  auto live = ListenUnix(path, 0600, 8, SOCK_SEQPACKET);
  ASSERT_TRUE(live.ok());
  absl::Status s = RemoveStaleSocket(path, {.type = SOCK_STREAM});
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(s.message()), HasSubstr("a socket of another type is bound there"));
  EXPECT_TRUE(S_ISSOCK(Lstat(path).st_mode));
}

TEST(PrepareSocketDirTest, AMissingDirectoryIsCreatedWithExactlyTheModeAskedAndTheGroup) {
  testing::TempDir dir;
  const mode_t old_umask = ::umask(077);  // would clear the group bits of a plain mkdir
  const gid_t gid = ::geteuid() == 0 ? 65534 : ::getegid();
  absl::Status s = PrepareSocketDir(dir / "a/b/s", 0750, static_cast<int>(gid));
  ::umask(old_umask);
  ASSERT_TRUE(s.ok()) << s;
  const struct stat st = Lstat(dir / "a/b/s");
  EXPECT_EQ(st.st_mode & 07777, 0750u);
  EXPECT_EQ(st.st_gid, gid);
  EXPECT_EQ(st.st_uid, ::geteuid());
}

// Before (issue 47): an existing directory was chmod'ed to the mode asked: the keeper turned
// a 1777 /tmp-like directory into 0700, the daemon made an existing socket dir 0750.
TEST(PrepareSocketDirTest, AnExistingSafeDirectoryIsUsedAsItIs) {
  testing::TempDir dir;
  for (const mode_t mode : {01777u, 0755u, 0711u, 0700u}) {
    const std::string d = dir / ("d" + std::to_string(mode));
    ASSERT_EQ(::mkdir(d.c_str(), 0700), 0);
    ASSERT_EQ(::chmod(d.c_str(), mode), 0);
    EXPECT_TRUE(PrepareSocketDir(d, 0700).ok()) << std::oct << mode;
    EXPECT_EQ(Lstat(d).st_mode & 07777, mode);
  }
}

TEST(PrepareSocketDirTest, AWritableOrForeignOrLinkedDirectoryIsRefusedAndLeftAsItIs) {
  testing::TempDir dir;
  const std::string open = dir / "open";
  ASSERT_EQ(::mkdir(open.c_str(), 0700), 0);
  ASSERT_EQ(::chmod(open.c_str(), 0777), 0);  // an emptyDir's mode: no sticky bit
  absl::Status s = PrepareSocketDir(open, 0700);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(s.message()), HasSubstr("directory " + open + " (mode 0777, owner uid"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("writable by its group or others without the "
                                                  "sticky bit"));
  EXPECT_EQ(Lstat(open).st_mode & 07777, 0777u);

  std::filesystem::create_symlink(dir / "open", dir / "link");
  s = PrepareSocketDir(dir / "link", 0700);
  EXPECT_THAT(std::string(s.message()), HasSubstr("a symlink is there, not a directory"));

  std::ofstream(dir / "file") << "x";
  s = PrepareSocketDir(dir / "file", 0700);
  EXPECT_THAT(std::string(s.message()), HasSubstr("a regular file is there, not a directory"));
  EXPECT_EQ(ReadAll(dir / "file"), "x");

  if (::geteuid() != 0) GTEST_SKIP() << "needs root to give a directory to uid 65534";
  const std::string foreign = dir / "foreign";
  ASSERT_EQ(::mkdir(foreign.c_str(), 0755), 0);
  ASSERT_EQ(::chown(foreign.c_str(), 65534, 65534), 0);
  s = PrepareSocketDir(foreign, 0700);
  EXPECT_THAT(std::string(s.message()), HasSubstr("belongs to another user"));
  EXPECT_EQ(Lstat(foreign).st_uid, 65534u);
}

// With --socket_gid the engines of that group must reach the sockets: an existing directory
// they cannot search is refused (it is not chown'ed to them).
TEST(PrepareSocketDirTest, AnExistingDirectoryTheEnginesGroupCannotSearchIsRefused) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to give a directory another group";
  testing::TempDir dir;
  const std::string d = dir / "s";
  ASSERT_EQ(::mkdir(d.c_str(), 0750), 0);
  ASSERT_EQ(::chown(d.c_str(), 0, 12345), 0);
  absl::Status s = PrepareSocketDir(d, 0750, 65534);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(s.message()), HasSubstr("is not searchable by group 65534"));
  EXPECT_EQ(Lstat(d).st_gid, 12345u);
  EXPECT_TRUE(PrepareSocketDir(d, 0750, 12345).ok());  // its own group searches it
  ASSERT_EQ(::chmod(d.c_str(), 0755), 0);
  EXPECT_TRUE(PrepareSocketDir(d, 0750, 65534).ok());  // everyone searches it
  EXPECT_EQ(Lstat(d).st_gid, 12345u);
}

}  // namespace
}  // namespace weightcache

namespace weightcache {
namespace {

// A kubelet volume's directory (/var/lib/kubelet/pods/<uid>/volumes/kubernetes.io~csi/<name>/
// mount) is longer than sockaddr_un holds: the socket is bound and reached through the
// directory, and a stale one found and replaced there too.
TEST(UnixSocketTest, ASocketInADirectoryLongerThanAnAddressIsBoundAndReached) {
  testing::TempDir dir;
  const std::string deep =
      dir / "pods/0a1b2c3d-0000-4000-8000-00000000000a/volumes/kubernetes.io~csi/weightcache/mount";
  std::filesystem::create_directories(deep);
  const std::string path = deep + "/control.sock";
  ASSERT_GT(path.size(), 107u);
  auto listening = ListenUnix(path, 0666);
  ASSERT_TRUE(listening.ok()) << listening.status();
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0666u);
  auto client = ConnectUnix(path);
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_EQ(RemoveStaleSocket(path).code(), absl::StatusCode::kAlreadyExists);
  listening->reset();
  EXPECT_TRUE(RemoveStaleSocket(path).ok());
  EXPECT_FALSE(std::filesystem::exists(path));
}

}  // namespace
}  // namespace weightcache
