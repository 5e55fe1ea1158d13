// Private I/O and validation helpers of pkg/safetensors. Not part of the public contract.
// Thread-safety: free functions, no shared state; safe from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "pkg/safetensors/safetensors.h"

namespace weightcache::safetensors::internal {

// Reads exactly `length` bytes at `offset` with pread, retrying on EINTR and short reads.
// A read that reaches end of file first is OUT_OF_RANGE naming `what`; an I/O error is
// the errno status naming `what`.
absl::Status PreadFull(int fd, void* dst, uint64_t length, uint64_t offset, std::string_view what);

// A piece of one read request: `length` bytes at `offset` within requests[request].
struct ReadChunk {
  size_t request = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
};

// Checks each request (a descriptor and a destination unless empty, no offset overflow;
// errors name the request's `what`) and cuts it into chunks of at most `chunk_bytes`
// (0: 16 MiB). Empty requests give no chunk.
absl::StatusOr<std::vector<ReadChunk>> SplitReads(const std::vector<ReadRequest>& requests,
                                                  uint64_t chunk_bytes);

// Writes all of `data`, retrying on EINTR and short writes.
absl::Status WriteAll(int fd, const void* data, size_t length, std::string_view what);

// "<path>: tensor '<name>'" for messages, the name escaped and cut (EscapeTruncated).
std::string TensorPrefix(const std::string& path, const std::string& name);

// A tensor name the reader accepts: at most limits.max_name_bytes bytes and no control
// character (C0 including NUL, DEL, C1). `name` is well-formed UTF-8 (the JSON was checked).
// INVALID_ARGUMENT naming `path`, the tensor, and the byte otherwise.
absl::Status CheckTensorName(const std::string& path, const std::string& name,
                             const Limits& limits);

// Last path component ("a/b/model.safetensors" -> "model.safetensors").
std::string Basename(const std::string& path);

// Lower-case hex SHA-256 of the concatenation of `a` and `b` (OpenSSL EVP).
absl::StatusOr<std::string> Sha256Hex(std::string_view a, std::string_view b);

}  // namespace weightcache::safetensors::internal
