// safetensors reader: opens single files and sharded checkpoints and validates them
// strictly before anything trusts them. Never trusts the file: every fault is an
// absl::Status whose message names the file, the tensor when there is one, and the fault.
//
// Beyond the format's own rules the reader refuses, as input no served checkpoint holds:
// tensor names with control characters (C0, DEL, C1: a NUL would make a C-string reader see
// another name) or longer than Limits::max_name_bytes; zero-sized dimensions (an empty
// tensor: the planner, loaders and clients would each need a case for 0-byte shards);
// headers nested deeper than a safetensors header can be. Every path is opened as a regular
// file only (O_NONBLOCK, fstat): a FIFO or device is an error naming it, never a hang.
//
// Format: 8-byte little-endian header length N, N bytes of UTF-8 JSON object
// {"name": {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]}, ...,
//  "__metadata__": {"k": "v"}}, then the data area; offsets are relative to its start. As in
// the reference reader, the tensors cover the data area exactly: a byte between two tensors or
// after the last is refused (it would enter the file's content digest, its identity, without
// being anything served).
//
// Thread-safety: File and Checkpoint are immutable after Open and safe to read from any
// number of threads (reads use pread on the owned descriptor).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "pkg/util/scoped_fd.h"

namespace weightcache::safetensors {

enum class DType {
  kBool,
  kU8,
  kI8,
  kF8_E4M3,
  kF8_E5M2,
  kI16,
  kU16,
  kF16,
  kBF16,
  kI32,
  kU32,
  kF32,
  kI64,
  kU64,
  kF64,
};

// Canonical safetensors name ("BF16", "F8_E4M3", ...).
std::string_view DTypeName(DType dtype);
// Size of one element in bytes.
size_t DTypeSize(DType dtype);
// Parses a safetensors dtype name; INVALID_ARGUMENT naming the unknown name otherwise.
absl::StatusOr<DType> ParseDType(std::string_view name);

struct Limits {
  // Largest header accepted (bytes of JSON). A larger one is refused unparsed.
  uint64_t max_header_bytes = 64ull << 20;
  // Largest number of tensors in one file.
  uint64_t max_tensors = 1u << 20;
  // Largest rank of one tensor.
  size_t max_rank = 8;
  // Longest tensor name (bytes). Names are echoed in errors and manifests all the way to the
  // client; real ones are under 200 bytes.
  size_t max_name_bytes = 1024;
};

struct TensorInfo {
  std::string name;
  DType dtype = DType::kU8;
  std::vector<int64_t> shape;
  uint64_t file_offset = 0;  // absolute byte offset in its file (data area start + begin)
  uint64_t nbytes = 0;
  size_t file_index = 0;  // index into Checkpoint::files() (0 for a lone File)

  uint64_t numel() const;
};

struct FileInfo {
  std::string path;           // as opened
  std::string name;           // basename, e.g. "model-00001-of-00002.safetensors"
  uint64_t size = 0;          // file size in bytes
  uint64_t data_offset = 0;   // 8 + header length
  std::string header_sha256;  // hex SHA-256 of the 8 length bytes and the header bytes
  std::map<std::string, std::string> metadata;  // "__metadata__"
};

// One open, validated .safetensors file.
class File {
 public:
  static absl::StatusOr<File> Open(const std::string& path, const Limits& limits = {});

  File(File&&) = default;
  File& operator=(File&&) = default;

  const FileInfo& info() const { return info_; }
  // Sorted by file_offset.
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  int fd() const { return fd_.get(); }

 private:
  File() = default;
  FileInfo info_;
  std::vector<TensorInfo> tensors_;
  ScopedFd fd_;
};

// A checkpoint directory: either model.safetensors.index.json with its shards, or the
// *.safetensors files in the directory (a single model.safetensors typically).
// Validates that index entries point at tensors that exist in the named shard, that no
// tensor name appears twice across files, and that every tensor of a shard is indexed.
class Checkpoint {
 public:
  static absl::StatusOr<Checkpoint> Open(const std::string& dir, const Limits& limits = {});

  Checkpoint(Checkpoint&&) = default;
  Checkpoint& operator=(Checkpoint&&) = default;

  const std::string& dir() const { return dir_; }
  // Sorted by name.
  const std::vector<File>& files() const { return files_; }
  // All tensors, sorted by name; file_index points into files().
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* Find(std::string_view name) const;
  uint64_t total_bytes() const;

 private:
  Checkpoint() = default;
  std::string dir_;
  std::vector<File> files_;
  std::vector<TensorInfo> tensors_;
};

// Large parallel preads. Each request is split into chunks of `chunk_bytes` spread over
// `threads` workers. `on_progress` (may be null) is called with the bytes finished so
// far, from worker threads, serialized.
struct ReadRequest {
  int fd = -1;
  uint64_t offset = 0;
  uint64_t length = 0;
  void* dst = nullptr;
  std::string_view what;  // for errors: "model.safetensors: tensor x"
};
using ReadTap = std::function<void(int fd, uint64_t offset, const void* data, uint64_t n)>;
struct ReadOptions {
  unsigned threads = 8;
  uint64_t chunk_bytes = 16ull << 20;
  // When set and true, chunks not yet started are skipped and the read fails with
  // CANCELLED (a load stopped by a daemon shutdown). Must outlive the read.
  const std::atomic<bool>* cancel = nullptr;
  // When set, called with each chunk as it lands (its descriptor, file offset, bytes), from
  // the worker that read it, before the chunk counts as done (so before its destination may
  // be reused): a digest that follows the load's reads (identity::FollowingSha256). Must
  // outlive the read; called concurrently.
  const ReadTap* tap = nullptr;
};
using ProgressFn = void (*)(void* ctx, uint64_t bytes_done);
absl::Status ReadRanges(const std::vector<ReadRequest>& requests, const ReadOptions& options,
                        ProgressFn on_progress = nullptr, void* progress_ctx = nullptr);

}  // namespace weightcache::safetensors
