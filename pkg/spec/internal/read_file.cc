#include "pkg/spec/internal/read_file.h"

#include <unistd.h>

#include <cerrno>

#include "absl/strings/str_cat.h"
#include "pkg/util/errno_status.h"
#include "pkg/util/regular_file.h"
#include "pkg/util/status_macros.h"

namespace weightcache::spec::internal {

absl::StatusOr<std::string> ReadTextFile(const std::string& path) {
  // A regular file only: a FIFO or device fails at once, naming what it is (never a hang).
  WC_ASSIGN_OR_RETURN(RegularFile file, OpenRegularFile(path));
  const ScopedFd& fd = file.fd;
  if (file.size > kMaxTextFileBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": ", file.size, " bytes, more than a text file may hold (", kMaxTextFileBytes, ")"));
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
