// The store's file and memfd helpers (pkg/artifact only, not a public header): sealed
// memfds, copies, and reading --artifact_dir through regular files only (issue 47: a blob
// that was a symlink to a FIFO hung GetArtifact past its deadline and held shutdown).
//
// Thread-safety: free functions on descriptors and paths the caller owns.
#pragma once

#include <sys/stat.h>

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "pkg/util/scoped_fd.h"

namespace weightcache::artifact {

// A memfd (close-on-exec, sealable) of `size` bytes, sparse: pages exist once written.
absl::StatusOr<ScopedFd> NewMemfd(const std::string& id, uint64_t size);
// Seals `fd` (a memfd of exactly its final size) for good and returns a read-only
// descriptor of it: what readers get.
absl::StatusOr<ScopedFd> SealReadOnly(int fd, const std::string& what);
// Copies `size` bytes from offset 0 of `from` to `to`; DATA_LOSS when `from` ends early.
absl::Status CopyAll(int from, int to, uint64_t size, const std::string& what);

// Opens `path` read-only when it is a regular file, without following a symbolic link and
// without blocking (a FIFO opens at once, and is then refused); `st` gets its stat.
// FAILED_PRECONDITION naming the path and what it is (a symbolic link, a FIFO, a directory,
// ...) otherwise; the open's errno status (NOT_FOUND when absent) when it cannot be opened.
absl::StatusOr<ScopedFd> OpenRegular(const std::string& path, struct stat* st);
// The whole of regular file `path` (OpenRegular's rules), at most `max_bytes`
// (FAILED_PRECONDITION past it); `st` gets its stat.
absl::StatusOr<std::string> ReadRegular(const std::string& path, size_t max_bytes, struct stat* st);

}  // namespace weightcache::artifact
