// libFuzzer target: model.safetensors.index.json through Checkpoint::Open. A directory with
// one fixed shard (tensors "a" and "b") is made once; each input becomes the index beside it.
// Whatever opens must be the shard's two tensors, indexed to it.
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "pkg/safetensors/safetensors.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

std::string g_dir;

void RemoveDir() {
  std::error_code ec;
  std::filesystem::remove_all(g_dir, ec);
}

void WriteFileOrDie(const std::string& path, const std::string& bytes) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  FUZZ_CHECK(fd >= 0);
  FUZZ_CHECK(::write(fd, bytes.data(), bytes.size()) == static_cast<ssize_t>(bytes.size()));
  ::close(fd);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  std::string tmpl = "/tmp/wc-fuzz-index.XXXXXX";
  FUZZ_CHECK(::mkdtemp(tmpl.data()) != nullptr);
  g_dir = tmpl;
  std::atexit(RemoveDir);  // libFuzzer ends with exit(), also on a finding
  const std::string header = R"({"a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},)"
                             R"("b":{"dtype":"BF16","shape":[4],"data_offsets":[16,24]}})";
  std::string shard(8, '\0');
  for (int i = 0; i < 8; ++i) shard[i] = static_cast<char>((header.size() >> (8 * i)) & 0xFF);
  shard += header + std::string(24, '\x01');
  WriteFileOrDie(g_dir + "/model-00001-of-00001.safetensors", shard);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  WriteFileOrDie(g_dir + "/model.safetensors.index.json",
                 std::string(reinterpret_cast<const char*>(data), size));
  auto ckpt = weightcache::safetensors::Checkpoint::Open(g_dir);
  if (!ckpt.ok()) {
    FUZZ_CHECK(!ckpt.status().message().empty());
    FUZZ_CHECK(ckpt.status().message().size() < 4096);
    return 0;
  }
  FUZZ_CHECK(ckpt->files().size() == 1);
  FUZZ_CHECK(ckpt->tensors().size() == 2);
  FUZZ_CHECK(ckpt->Find("a") != nullptr && ckpt->Find("b") != nullptr);
  FUZZ_CHECK(ckpt->total_bytes() == 24);
  return 0;
}
