#include "pkg/spec/internal/read_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "absl/strings/str_cat.h"
#include "pkg/util/errno_status.h"
#include "pkg/util/scoped_fd.h"

namespace weightcache::spec::internal {

absl::StatusOr<std::string> ReadTextFile(const std::string& path) {
  ScopedFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) return ErrnoStatus(errno, "open", path);
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return ErrnoStatus(errno, "fstat", path);
  if (S_ISDIR(st.st_mode)) return ErrnoStatus(EISDIR, "read", path);
  if (st.st_size > static_cast<off_t>(kMaxTextFileBytes)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", st.st_size,
                                                   " bytes, more than a text file may hold (",
                                                   kMaxTextFileBytes, ")"));
  }
  std::string text;
  char buf[64 * 1024];
  for (;;) {
    ssize_t n = ::read(fd.get(), buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, "read", path);
    }
    if (n == 0) break;
    text.append(buf, static_cast<size_t>(n));
    if (text.size() > kMaxTextFileBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": more than ", kMaxTextFileBytes, " bytes"));
    }
  }
  return text;
}

}  // namespace weightcache::spec::internal
