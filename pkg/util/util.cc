#include <fcntl.h>
#include <string.h>
#include <sys/time.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <ctime>

#include "absl/strings/str_cat.h"
#include "pkg/util/errno_status.h"
#include "pkg/util/log.h"
#include "pkg/util/scoped_fd.h"

namespace weightcache {

absl::StatusOr<ScopedFd> ScopedFd::Dup() const {
  int fd = ::fcntl(fd_, F_DUPFD_CLOEXEC, 0);
  if (fd < 0) return ErrnoStatus(errno, "dup");
  return ScopedFd(fd);
}

absl::Status ErrnoStatus(int err, std::string_view call, std::string_view subject) {
  // Debian's abseil has its own absl::string_view (not std's): build with std::string.
  std::string msg(call);
  if (!subject.empty()) msg.append(" ").append(subject);
  msg.append(": ").append(::strerror(err));
  switch (err) {
    case ENOENT:
      return absl::NotFoundError(msg);
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(msg);
    case EEXIST:
      return absl::AlreadyExistsError(msg);
    case EINVAL:
    case ENOTDIR:
    case EISDIR:
      return absl::InvalidArgumentError(msg);
    case ENOMEM:
    case ENOSPC:
    case EMFILE:
    case ENFILE:
      return absl::ResourceExhaustedError(msg);
    case EPIPE:
    case ECONNRESET:
    case ECONNREFUSED:
      return absl::UnavailableError(msg);
    default:
      return absl::InternalError(msg);
  }
}

namespace {
std::atomic<int> g_level{static_cast<int>(LogLevel::kInfo)};
}

void SetLogLevel(LogLevel level) { g_level.store(static_cast<int>(level)); }
bool LogEnabled(LogLevel level) { return static_cast<int>(level) >= g_level.load(); }

void LogLine(LogLevel level, std::string_view msg) {
  static constexpr const char* kTags = "DIWE";
  struct timeval tv;
  ::gettimeofday(&tv, nullptr);
  struct tm tm;
  ::gmtime_r(&tv.tv_sec, &tm);
  char ts[32];
  std::strftime(ts, sizeof ts, "%Y-%m-%dT%H:%M:%S", &tm);
  // One fprintf per line keeps lines from different threads whole.
  std::fprintf(stderr, "%c %s.%06ldZ %.*s\n", kTags[static_cast<int>(level)], ts,
               static_cast<long>(tv.tv_usec), static_cast<int>(msg.size()), msg.data());
}

void CheckFailed(const char* file, int line, const char* cond) {
  std::fprintf(stderr, "F %s:%d check failed: %s\n", file, line, cond);
  std::abort();
}

}  // namespace weightcache
