// libFuzzer target: the safetensors header validator (File::Open). The input is the header
// JSON; the harness puts the 8-byte length in front and a 4 KiB data area behind it in a
// memfd, and opens it by path like a real shard. Whatever File::Open accepts must satisfy
// the reader's contract: spans inside the data area, sizes consistent, no overlaps, names
// free of control characters.
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "pkg/safetensors/safetensors.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

constexpr size_t kDataBytes = 4096;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using weightcache::safetensors::File;
  const int fd = ::memfd_create("fuzz.safetensors", MFD_CLOEXEC);
  FUZZ_CHECK(fd >= 0);
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((uint64_t{size} >> (8 * i)) & 0xFF);
  bytes.append(reinterpret_cast<const char*>(data), size);
  FUZZ_CHECK(::write(fd, bytes.data(), bytes.size()) == static_cast<ssize_t>(bytes.size()));
  FUZZ_CHECK(::ftruncate(fd, static_cast<off_t>(bytes.size() + kDataBytes)) == 0);
  const std::string path = "/proc/self/fd/" + std::to_string(fd);

  auto file = File::Open(path);
  ::close(fd);
  if (!file.ok()) {
    FUZZ_CHECK(!file.status().message().empty());
    FUZZ_CHECK(file.status().message().size() < 4096);  // errors quote input cut short
    return 0;
  }
  const uint64_t data_begin = 8 + size;
  FUZZ_CHECK(file->info().data_offset == data_begin);
  uint64_t prev_end = data_begin;
  for (const auto& t : file->tensors()) {  // sorted by offset
    FUZZ_CHECK(t.nbytes > 0);
    FUZZ_CHECK(t.numel() * weightcache::safetensors::DTypeSize(t.dtype) == t.nbytes);
    FUZZ_CHECK(t.file_offset >= prev_end);
    FUZZ_CHECK(t.file_offset + t.nbytes <= data_begin + kDataBytes);
    prev_end = t.file_offset + t.nbytes;
    for (char c : t.name) FUZZ_CHECK(static_cast<unsigned char>(c) >= 0x20 && c != 0x7F);
    for (int64_t d : t.shape) FUZZ_CHECK(d > 0);
  }
  return 0;
}
