// ReadQueue: batches read in parallel by long-lived workers equal plain reads; a batch's
// error stays in that batch; the destructor stops with batches still queued.
#include "pkg/safetensors/read_queue.h"

#include <fcntl.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "pkg/safetensors/internal/test_util.h"
#include "pkg/util/scoped_fd.h"

namespace weightcache::safetensors {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using testing::TempDir;

struct File {
  TempDir dir;
  std::string path;
  std::vector<uint8_t> data;
  ScopedFd fd;
  explicit File(size_t size) : path(dir.File("data.bin")), data(testing::Pattern(size, 7)) {
    testing::WriteBytes(path, std::string_view(reinterpret_cast<const char*>(data.data()), size));
    fd = ScopedFd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  }
};

TEST(ReadQueueTest, ManyBatchesInFlightEqualThePlainBytes) {
  File f((3 << 20) + 777);
  ASSERT_TRUE(f.fd.valid());
  ReadQueue q({.threads = 5, .chunk_bytes = 4099});  // chunks straddle pages and ends
  // 40 batches of 3 requests each, at offsets spread over the file, all submitted before
  // any is waited for (the loader keeps a ring of them in flight).
  constexpr int kBatches = 40;
  std::vector<std::vector<std::vector<uint8_t>>> out(kBatches);
  std::vector<std::vector<std::pair<uint64_t, uint64_t>>> where(kBatches);
  std::vector<uint64_t> tickets;
  for (int b = 0; b < kBatches; ++b) {
    std::vector<ReadRequest> reqs;
    for (int r = 0; r < 3; ++r) {
      const uint64_t off = (static_cast<uint64_t>(b) * 77777 + r * 131071) % (f.data.size() - 1);
      const uint64_t len = std::min<uint64_t>(f.data.size() - off, 10000 + 3000 * r + b);
      out[b].emplace_back(len, 0xEE);
      where[b].push_back({off, len});
    }
    for (int r = 0; r < 3; ++r) {
      reqs.push_back({f.fd.get(), where[b][r].first, where[b][r].second, out[b][r].data(), "data"});
    }
    auto t = q.Submit(std::move(reqs));
    ASSERT_TRUE(t.ok()) << t.status();
    tickets.push_back(*t);
  }
  for (int b = 0; b < kBatches; ++b) {
    ASSERT_TRUE(q.Wait(tickets[b]).ok());
    EXPECT_TRUE(q.Done(tickets[b]));  // waited for: no longer known, so done
    for (int r = 0; r < 3; ++r) {
      const auto [off, len] = where[b][r];
      ASSERT_TRUE(std::equal(out[b][r].begin(), out[b][r].end(), f.data.begin() + off))
          << "batch " << b << " request " << r;
      (void)len;
    }
  }
}

TEST(ReadQueueTest, AnErrorStaysInItsBatchAndNamesTheRequest) {
  File f(1000);
  ReadQueue q({.threads = 3, .chunk_bytes = 64});
  std::vector<uint8_t> a(500), bad(200), c(300);
  auto ta = q.Submit({{f.fd.get(), 0, 500, a.data(), "first"}});
  auto tb = q.Submit({{f.fd.get(), 900, 200, bad.data(), "model.safetensors: tensor 'lm_head'"}});
  auto tc = q.Submit({{f.fd.get(), 700, 300, c.data(), "third"}});
  ASSERT_TRUE(ta.ok() && tb.ok() && tc.ok());
  EXPECT_TRUE(q.Wait(*ta).ok());
  absl::Status s = q.Wait(*tb);
  EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(std::string(s.message()), AllOf(HasSubstr("model.safetensors: tensor 'lm_head'"),
                                              HasSubstr("read past end of file")));
  EXPECT_TRUE(q.Wait(*tc).ok());
  EXPECT_TRUE(std::equal(c.begin(), c.end(), f.data.begin() + 700));
  EXPECT_EQ(q.Wait(*tc).code(), absl::StatusCode::kInvalidArgument);  // waited for once
}

TEST(ReadQueueTest, BadRequestsAreRefusedAtSubmit) {
  ReadQueue q({});
  std::vector<uint8_t> out(16);
  auto t = q.Submit({{-1, 0, 16, out.data(), "shard-8"}});
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(t.status().message()), HasSubstr("shard-8"));
  auto empty = q.Submit({});
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(q.Done(*empty));
  EXPECT_TRUE(q.Wait(*empty).ok());
}

TEST(ReadQueueTest, DestructorStopsWithBatchesQueued) {
  File f(1 << 20);
  std::vector<std::vector<uint8_t>> out(64, std::vector<uint8_t>(1 << 20));
  {
    ReadQueue q({.threads = 2, .chunk_bytes = 4096});  // 16k chunks: most never start
    for (auto& o : out) {
      ASSERT_TRUE(q.Submit({{f.fd.get(), 0, o.size(), o.data(), "big"}}).ok());
    }
  }  // must return promptly, every worker joined
  SUCCEED();
}

}  // namespace
}  // namespace weightcache::safetensors
