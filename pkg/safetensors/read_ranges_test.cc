// ReadRanges: chunked parallel reads equal a plain read; progress and errors.
#include <fcntl.h>
#include <unistd.h>

#include <mutex>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "pkg/safetensors/internal/test_util.h"
#include "pkg/safetensors/safetensors.h"
#include "pkg/util/scoped_fd.h"

namespace weightcache::safetensors {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using testing::TempDir;

struct Progress {
  std::mutex mu;  // only to make the test's own check race-free under TSan-like tools
  std::vector<uint64_t> seen;
  static void Record(void* ctx, uint64_t done) {
    auto* p = static_cast<Progress*>(ctx);
    std::lock_guard<std::mutex> lock(p->mu);
    p->seen.push_back(done);
  }
};

ScopedFd OpenRead(const std::string& path) {
  return ScopedFd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
}

TEST(ReadRangesTest, ManyThreadsSmallChunksEqualPlainRead) {
  TempDir dir;
  const std::string path = dir.File("data.bin");
  constexpr size_t kSize = (1 << 20) + 12345;
  const std::vector<uint8_t> data = testing::Pattern(kSize, 5);
  testing::WriteBytes(path, std::string_view(reinterpret_cast<const char*>(data.data()), kSize));
  ScopedFd fd = OpenRead(path);
  ASSERT_TRUE(fd.valid());

  struct Range {
    uint64_t offset, length;
  };
  const std::vector<Range> ranges = {{0, kSize},       {1, 3},      {4095, 4097},
                                     {kSize - 10, 10}, {500000, 0}, {123, 300000}};
  std::vector<std::vector<uint8_t>> out(ranges.size());
  std::vector<ReadRequest> requests;
  uint64_t total = 0;
  for (size_t i = 0; i < ranges.size(); ++i) {
    out[i].assign(ranges[i].length, 0xEE);
    requests.push_back({fd.get(), ranges[i].offset, ranges[i].length, out[i].data(), "data.bin"});
    total += ranges[i].length;
  }
  Progress progress;
  ReadOptions options;
  options.threads = 6;
  options.chunk_bytes = 4099;  // odd size: chunks straddle pages and request ends
  ASSERT_TRUE(ReadRanges(requests, options, &Progress::Record, &progress).ok());

  for (size_t i = 0; i < ranges.size(); ++i) {
    std::vector<uint8_t> plain(ranges[i].length);
    ASSERT_EQ(::pread(fd.get(), plain.data(), plain.size(), static_cast<off_t>(ranges[i].offset)),
              static_cast<ssize_t>(plain.size()));
    EXPECT_EQ(out[i], plain) << "range " << i;
  }
  ASSERT_FALSE(progress.seen.empty());
  EXPECT_TRUE(std::is_sorted(progress.seen.begin(), progress.seen.end()));
  EXPECT_EQ(progress.seen.back(), total);
  uint64_t expected_calls = 0;
  for (const Range& r : ranges) expected_calls += (r.length + 4098) / 4099;
  EXPECT_EQ(progress.seen.size(), expected_calls);  // one call per chunk
}

TEST(ReadRangesTest, ReadPastEndOfFileNamesWhat) {
  TempDir dir;
  const std::string path = dir.File("model.safetensors");
  testing::WriteBytes(path, std::string(1000, 'x'));
  ScopedFd fd = OpenRead(path);
  std::vector<uint8_t> out(200);
  absl::Status s =
      ReadRanges({{fd.get(), 900, 200, out.data(), "model.safetensors: tensor 'lm_head.weight'"}},
                 {.threads = 3, .chunk_bytes = 64});
  EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(std::string(s.message()),
              AllOf(HasSubstr("model.safetensors: tensor 'lm_head.weight'"),
                    HasSubstr("read past end of file")));
}

TEST(ReadRangesTest, BadDescriptorNamesWhat) {
  std::vector<uint8_t> out(16);
  absl::Status s = ReadRanges({{1 << 29, 0, 16, out.data(), "shard-7"}}, {});
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()),
              AllOf(HasSubstr("pread shard-7"), HasSubstr("Bad file descriptor")));
  s = ReadRanges({{-1, 0, 16, out.data(), "shard-8"}}, {});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("shard-8"));
}

TEST(ReadRangesTest, ZeroThreadsAndEmptyRequests) {
  TempDir dir;
  const std::string path = dir.File("d");
  testing::WriteBytes(path, "abcdefgh");
  ScopedFd fd = OpenRead(path);
  EXPECT_TRUE(ReadRanges({}, {}).ok());
  char out[4] = {};
  ASSERT_TRUE(ReadRanges({{fd.get(), 2, 4, out, "d"}}, {.threads = 0, .chunk_bytes = 0}).ok());
  EXPECT_EQ(std::string(out, 4), "cdef");
}

}  // namespace
}  // namespace weightcache::safetensors
