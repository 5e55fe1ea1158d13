// Opening input files (config.json, index JSON, *.safetensors, spec files) as regular files
// only. A FIFO, device or socket where a file is expected must fail at once with an error that
// says what it is, never block the caller: the open is O_NONBLOCK (opening a FIFO with no
// writer does not wait) and the type is checked with fstat on the opened descriptor (no race
// between the check and the open). Thread-safety: pure functions.
#pragma once

#include <sys/stat.h>
#include <sys/types.h>

#include <string>

#include "absl/status/statusor.h"
#include "pkg/util/scoped_fd.h"

namespace weightcache {

// "a regular file", "a directory", "a FIFO", "a character device", "a block device",
// "a socket", "a symbolic link" or "an unknown file type".
const char* FileTypeName(mode_t mode);

struct RegularFile {
  ScopedFd fd;  // O_RDONLY | O_CLOEXEC | O_NONBLOCK (no effect on reads of a regular file)
  uint64_t size = 0;
  dev_t dev = 0;
  ino_t ino = 0;
};

// Opens `path` (symlinks followed) for reading. errno failures are ErrnoStatus ("open <path>:
// No such file or directory" as NOT_FOUND); anything but a regular file is INVALID_ARGUMENT
// "<path>: is a FIFO, not a regular file" (the type named).
absl::StatusOr<RegularFile> OpenRegularFile(const std::string& path);

}  // namespace weightcache
