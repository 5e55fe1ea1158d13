#include "pkg/util/regular_file.h"

#include <fcntl.h>

#include <cerrno>

#include "absl/strings/str_cat.h"
#include "pkg/util/errno_status.h"

namespace weightcache {

const char* FileTypeName(mode_t mode) {
  switch (mode & S_IFMT) {
    case S_IFREG:
      return "a regular file";
    case S_IFDIR:
      return "a directory";
    case S_IFIFO:
      return "a FIFO";
    case S_IFCHR:
      return "a character device";
    case S_IFBLK:
      return "a block device";
    case S_IFSOCK:
      return "a socket";
    case S_IFLNK:
      return "a symbolic link";
    default:
      return "an unknown file type";
  }
}

absl::StatusOr<RegularFile> OpenRegularFile(const std::string& path) {
  RegularFile file;
  // O_NOCTTY: a terminal device must not become the controlling one by being opened here.
  file.fd.reset(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY));
  if (!file.fd) {
    const int err = errno;
    struct stat st {};
    if (err == ENXIO && ::stat(path.c_str(), &st) == 0 && S_ISSOCK(st.st_mode)) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": is a socket, not a regular file"));
    }
    return ErrnoStatus(err, "open", path);
  }
  struct stat st {};
  if (::fstat(file.fd.get(), &st) != 0) return ErrnoStatus(errno, "fstat", path);
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": is ", FileTypeName(st.st_mode), ", not a regular file"));
  }
  file.size = static_cast<uint64_t>(st.st_size);
  file.dev = st.st_dev;
  file.ino = st.st_ino;
  return file;
}

}  // namespace weightcache
