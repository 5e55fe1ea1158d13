// libFuzzer target: the safetensors header validator (File::Open). The input is the header
// JSON; the harness puts the 8-byte length in front and a data area behind it in a memfd (as
// long as the furthest data_offsets end the header names, up to 64 KiB; 4 KiB when it names
// none: the tensors must cover it exactly), and opens it by path like a real shard. Whatever
// File::Open accepts must satisfy the reader's contract: the tensors cover the data area
// exactly with no overlap or gap, sizes consistent, names free of control characters.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>

#include "nlohmann/json.hpp"
#include "pkg/safetensors/safetensors.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

// The data area's size: the furthest end any entry's data_offsets names, when that is at most
// 64 KiB; 4 KiB otherwise (then only a header that names no such end can be accepted).
uint64_t DataBytes(const uint8_t* data, size_t size) {
  const auto root = nlohmann::json::parse(data, data + size, nullptr, /*allow_exceptions=*/false);
  uint64_t end = 0;
  if (root.is_object()) {
    for (const auto& [name, entry] : root.items()) {
      if (!entry.is_object() || !entry.contains("data_offsets")) continue;
      const auto& offsets = entry["data_offsets"];
      if (offsets.is_array() && offsets.size() == 2 && offsets[1].is_number_unsigned()) {
        end = std::max(end, offsets[1].get<uint64_t>());
      }
    }
  }
  return end > 0 && end <= (64u << 10) ? end : 4096;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using weightcache::safetensors::File;
  const int fd = ::memfd_create("fuzz.safetensors", MFD_CLOEXEC);
  FUZZ_CHECK(fd >= 0);
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((uint64_t{size} >> (8 * i)) & 0xFF);
  bytes.append(reinterpret_cast<const char*>(data), size);
  FUZZ_CHECK(::write(fd, bytes.data(), bytes.size()) == static_cast<ssize_t>(bytes.size()));
  const uint64_t data_bytes = DataBytes(data, size);
  FUZZ_CHECK(::ftruncate(fd, static_cast<off_t>(bytes.size() + data_bytes)) == 0);
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
    FUZZ_CHECK(t.file_offset == prev_end);
    prev_end = t.file_offset + t.nbytes;
    for (char c : t.name) FUZZ_CHECK(static_cast<unsigned char>(c) >= 0x20 && c != 0x7F);
    for (int64_t d : t.shape) FUZZ_CHECK(d > 0);
  }
  FUZZ_CHECK(prev_end == data_begin + data_bytes);
  return 0;
}
