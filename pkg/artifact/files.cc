#include "pkg/artifact/internal/files.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <vector>

#include "absl/strings/str_cat.h"
#include "pkg/util/errno_status.h"

namespace weightcache::artifact {
namespace {

const char* KindOf(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISLNK(mode)) return "a symbolic link";
  return "not a regular file";
}

}  // namespace

absl::StatusOr<ScopedFd> NewMemfd(const std::string& id, uint64_t size) {
  ScopedFd fd(::memfd_create(("wc-" + id.substr(0, 20)).c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd) return ErrnoStatus(errno, "memfd_create", id);
  if (::ftruncate(fd.get(), static_cast<off_t>(size)) != 0) {
    return ErrnoStatus(errno, "ftruncate memfd", id);
  }
  return fd;
}

absl::StatusOr<ScopedFd> SealReadOnly(int fd, const std::string& what) {
  constexpr int kSeals = F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;
  if (::fcntl(fd, F_ADD_SEALS, kSeals) != 0) return ErrnoStatus(errno, "F_ADD_SEALS", what);
  const std::string self = absl::StrCat("/proc/self/fd/", fd);
  ScopedFd ro(::open(self.c_str(), O_RDONLY | O_CLOEXEC));
  if (!ro) return ErrnoStatus(errno, "reopen read-only", what);
  return ro;
}

absl::Status CopyAll(int from, int to, uint64_t size, const std::string& what) {
  std::vector<char> buf(4 << 20);
  uint64_t off = 0;
  while (off < size) {
    const size_t want = std::min<uint64_t>(buf.size(), size - off);
    const ssize_t n = ::pread(from, buf.data(), want, static_cast<off_t>(off));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoStatus(errno, "read", what);
    if (n == 0) return absl::DataLossError(absl::StrCat(what, ": ends at byte ", off));
    for (ssize_t done = 0; done < n;) {
      const ssize_t w = ::pwrite(to, buf.data() + done, static_cast<size_t>(n - done),
                                 static_cast<off_t>(off + done));
      if (w < 0 && errno == EINTR) continue;
      if (w < 0) return ErrnoStatus(errno, "write", what);
      done += w;
    }
    off += static_cast<uint64_t>(n);
  }
  return absl::OkStatus();
}

absl::StatusOr<ScopedFd> OpenRegular(const std::string& path, struct stat* st) {
  // O_NONBLOCK: opening a FIFO for reading would wait for a writer; regular files ignore it.
  ScopedFd fd(::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC));
  if (!fd) {
    if (errno == ELOOP) {
      return absl::FailedPreconditionError(
          absl::StrCat(path, " is a symbolic link; only regular files are read"));
    }
    return ErrnoStatus(errno, "open", path);
  }
  if (::fstat(fd.get(), st) != 0) return ErrnoStatus(errno, "fstat", path);
  if (!S_ISREG(st->st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, " is ", KindOf(st->st_mode), "; only regular files are read"));
  }
  return fd;
}

absl::StatusOr<std::string> ReadRegular(const std::string& path, size_t max_bytes,
                                        struct stat* st) {
  auto fd = OpenRegular(path, st);
  if (!fd.ok()) return fd.status();
  if (static_cast<uint64_t>(st->st_size) > max_bytes) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, " holds ", st->st_size, " bytes, more than ", max_bytes));
  }
  std::string out(static_cast<size_t>(st->st_size), '\0');
  size_t off = 0;
  while (off < out.size()) {
    const ssize_t n =
        ::pread(fd->get(), out.data() + off, out.size() - off, static_cast<off_t>(off));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoStatus(errno, "read", path);
    if (n == 0) break;
    off += static_cast<size_t>(n);
  }
  out.resize(off);
  return out;
}

}  // namespace weightcache::artifact
