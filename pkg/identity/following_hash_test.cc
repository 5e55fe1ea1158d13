// FollowingSha256 (issue 58): a file's SHA-256 from the chunks other threads read, offered in
// any order and from many threads at once, is the file's SHA-256; what was never offered (or
// found the hold full) is read once by Finish, and nothing else.
#include "pkg/identity/following_hash.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "pkg/identity/identity.h"
#include "tests/testutil/temp_dir.h"

namespace weightcache::identity {
namespace {

struct TestFile {
  std::string path, bytes;
  int fd = -1;
  ~TestFile() {
    if (fd >= 0) ::close(fd);
  }
};

void Write(TestFile& f, const std::string& path, size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  f.path = path;
  f.bytes.resize(n);
  for (auto& c : f.bytes) c = static_cast<char>(rng());
  const int w = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  ASSERT_GE(w, 0);
  ASSERT_EQ(::write(w, f.bytes.data(), n), static_cast<ssize_t>(n));
  ::close(w);
  f.fd = ::open(path.c_str(), O_RDONLY);
  ASSERT_GE(f.fd, 0);
}

// A file of n random bytes in its own temp dir, with a second, O_DIRECT descriptor as a cold
// load's reads have (-1 where the dir refuses O_DIRECT: the test skips, saying so).
struct DirectFile {
  testing::TempDir dir;
  TestFile f;
  int direct = -1;
  ~DirectFile() {
    if (direct >= 0) ::close(direct);
  }
};

void WriteDirect(DirectFile& d, size_t n, uint32_t seed) {
  ASSERT_NO_FATAL_FAILURE(Write(d.f, d.dir.path() + "/a", n, seed));
  d.direct = ::open(d.f.path.c_str(), O_RDONLY | O_DIRECT);
}

// Whether a file was reported hashed whole (on_file) during the load, before Finish.
struct Reported {
  std::mutex mu;
  std::condition_variable cv;
  bool reported = false;
  std::function<void(size_t, const std::string&)> callback() {
    return [this](size_t, const std::string&) {
      std::lock_guard<std::mutex> l(mu);
      reported = true;
      cv.notify_all();
    };
  }
  // A wait that only ends a broken run (the old ways never reported before Finish).
  bool Wait() {
    std::unique_lock<std::mutex> l(mu);
    return cv.wait_for(l, std::chrono::seconds(20), [&] { return reported; });
  }
};

// The O_DIRECT tests of the hold: a file of 64 KiB chunks with an O_DIRECT descriptor (the
// test skips, saying why, where the temp dir refuses O_DIRECT), offered chunk by chunk.
class FollowingSha256Direct : public ::testing::Test {
 protected:
  static constexpr uint64_t kChunk = 65'536;
  void Write(uint64_t chunks, uint32_t seed) {
    ASSERT_NO_FATAL_FAILURE(WriteDirect(d_, chunks * kChunk, seed));
    if (d_.direct < 0)
      GTEST_SKIP() << d_.dir.path() << " refuses O_DIRECT: " << std::strerror(errno);
  }
  // The file followed with a hold of one chunk.
  std::unique_ptr<FollowingSha256> Follow(std::function<void(size_t, const std::string&)> on_file,
                                          std::chrono::milliseconds stall) {
    return std::make_unique<FollowingSha256>(
        std::vector<FollowingSha256::File>{{d_.f.fd, d_.f.bytes.size(), d_.f.path}},
        /*hold_bytes=*/kChunk, std::move(on_file), /*hashers=*/0, stall);
  }
  void Offer(FollowingSha256& h, uint64_t k) {
    h.Offer(d_.direct, k * kChunk, d_.f.bytes.data() + k * kChunk, kChunk);
  }
  const std::string& bytes() const { return d_.f.bytes; }
  DirectFile d_;
};

struct Chunk {
  size_t file;
  uint64_t offset, n;
};

// Chunks of both files offered in a shuffled order by four threads; a small hold, so some
// chunks are left for Finish. Every file's digest is its SHA-256; bytes hashed from the
// offers plus bytes Finish read are the files' sizes, exactly.
TEST(FollowingSha256, ParallelOffersInAnyOrderHashEachFileOnce) {
  testing::TempDir dir;
  TestFile a, b;
  ASSERT_NO_FATAL_FAILURE(Write(a, dir.path() + "/a", 3'000'001, 1));
  ASSERT_NO_FATAL_FAILURE(Write(b, dir.path() + "/b", 1'234'567, 2));
  const TestFile* files[] = {&a, &b};
  std::vector<std::pair<size_t, std::string>> early;
  std::mutex early_mu;
  FollowingSha256 h({{a.fd, a.bytes.size(), a.path}, {b.fd, b.bytes.size(), b.path}},
                    /*hold_bytes=*/200'000, [&](size_t i, const std::string& d) {
                      std::lock_guard<std::mutex> l(early_mu);
                      early.emplace_back(i, d);
                    });
  ASSERT_TRUE(h.Start(0, 100).ok());  // a "header" the offers never cover
  std::vector<Chunk> chunks;
  for (size_t f = 0; f < 2; ++f) {
    for (uint64_t off = f == 0 ? 100 : 0; off < files[f]->bytes.size(); off += 65'536) {
      chunks.push_back({f, off, std::min<uint64_t>(65'536, files[f]->bytes.size() - off)});
    }
  }
  // Mostly in order (as a load's readers are), with local shuffles; one chunk offered twice.
  std::mt19937 rng(7);
  for (size_t i = 0; i + 8 < chunks.size(); i += 8) {
    std::shuffle(chunks.begin() + static_cast<long>(i), chunks.begin() + static_cast<long>(i + 8),
                 rng);
  }
  chunks.push_back(chunks[3]);
  chunks.erase(chunks.begin() + 20);  // never offered: Finish reads it
  std::atomic<size_t> next{0};
  std::vector<std::thread> readers;
  for (int t = 0; t < 4; ++t) {
    readers.emplace_back([&] {
      for (size_t i = next++; i < chunks.size(); i = next++) {
        const Chunk& c = chunks[i];
        h.Offer(files[c.file]->fd, c.offset, files[c.file]->bytes.data() + c.offset, c.n);
      }
    });
  }
  for (auto& t : readers) t.join();
  h.Offer(12345, 0, "x", 1);  // a descriptor of no followed file: ignored
  auto digests = h.Finish();
  ASSERT_TRUE(digests.ok()) << digests.status();
  EXPECT_EQ((*digests)[0], "sha256:" + Sha256Hex(a.bytes));
  EXPECT_EQ((*digests)[1], "sha256:" + Sha256Hex(b.bytes));
  EXPECT_EQ(h.followed_bytes() + h.reread_bytes(), a.bytes.size() + b.bytes.size());
  EXPECT_GE(h.reread_bytes(), 100u + 65'536u);  // the header and the chunk never offered
  for (const auto& [i, d] : early) EXPECT_EQ(d, (*digests)[i]);
}

// Another descriptor of the same file (the load's O_DIRECT one) is that file; a descriptor
// of another file with the same bytes is not.
TEST(FollowingSha256, AnotherDescriptorOfTheFileCountsAndAnotherFileDoesNot) {
  testing::TempDir dir;
  TestFile a, copy;
  ASSERT_NO_FATAL_FAILURE(Write(a, dir.path() + "/a", 100'000, 3));
  ASSERT_NO_FATAL_FAILURE(Write(copy, dir.path() + "/copy", 100'000, 3));
  const int again = ::open(a.path.c_str(), O_RDONLY);
  ASSERT_GE(again, 0);
  FollowingSha256 h({{a.fd, a.bytes.size(), a.path}}, 1 << 20, nullptr);
  h.Offer(copy.fd, 0, copy.bytes.data(), copy.bytes.size());
  h.Offer(again, 0, a.bytes.data(), a.bytes.size());
  auto digests = h.Finish();
  ASSERT_TRUE(digests.ok());
  EXPECT_EQ((*digests)[0], "sha256:" + Sha256Hex(a.bytes));
  EXPECT_EQ(h.followed_bytes(), a.bytes.size());  // the copy's offer counted for nothing
  EXPECT_EQ(h.reread_bytes(), 0u);
  ::close(again);
}

// The finding of issue 58's first device run: the reader whose chunk reached a file's cursor
// hashed it (and every held chunk behind it) before it could read on, so a load waited for
// one core's SHA-256 per file. Now a reader only copies: the file's last byte is hashed, and
// reported, by another thread than the one that offered every chunk.
TEST(FollowingSha256, OnePassTheReaderOnlyCopiesAHasherHashes) {
  testing::TempDir dir;
  TestFile a;
  ASSERT_NO_FATAL_FAILURE(Write(a, dir.path() + "/a", 1'000'000, 5));
  std::mutex mu;
  std::vector<std::thread::id> reported;
  FollowingSha256 h({{a.fd, a.bytes.size(), a.path}}, 4 << 20, [&](size_t, const std::string&) {
    std::lock_guard<std::mutex> l(mu);
    reported.push_back(std::this_thread::get_id());
  });
  for (uint64_t off = 0; off < a.bytes.size(); off += 100'000) {
    h.Offer(a.fd, off, a.bytes.data() + off, 100'000);
  }
  auto digests = h.Finish();
  ASSERT_TRUE(digests.ok()) << digests.status();
  EXPECT_EQ((*digests)[0], "sha256:" + Sha256Hex(a.bytes));
  EXPECT_EQ(h.followed_bytes(), a.bytes.size());
  std::lock_guard<std::mutex> l(mu);
  ASSERT_EQ(reported.size(), 1u);
  EXPECT_NE(reported[0], std::this_thread::get_id()) << "the offering thread hashed the file";
}

// Files are hashed side by side, not one after another: while file 0's report is held up
// (its hasher blocked in the callback until file 1 is reported), file 1, offered after all
// of file 0 by the same reader, is still hashed and reported. Hashed on the offering thread
// (the old way), file 1 is never offered and file 0's report gives up after its wait.
TEST(FollowingSha256, ParallelDigestFilesAreHashedSideBySide) {
  testing::TempDir dir;
  TestFile a, b;
  ASSERT_NO_FATAL_FAILURE(Write(a, dir.path() + "/a", 300'000, 6));
  ASSERT_NO_FATAL_FAILURE(Write(b, dir.path() + "/b", 300'000, 7));
  std::mutex mu;
  std::condition_variable cv;
  bool second_reported = false, first_gave_up = false;
  FollowingSha256 h(
      {{a.fd, a.bytes.size(), a.path}, {b.fd, b.bytes.size(), b.path}}, 4 << 20,
      [&](size_t i, const std::string&) {
        std::unique_lock<std::mutex> l(mu);
        if (i == 1) {
          second_reported = true;
          cv.notify_all();
          return;
        }
        // A wait that only ends a broken run (the old way never reports file 1).
        first_gave_up = !cv.wait_for(l, std::chrono::seconds(20), [&] { return second_reported; });
      },
      /*hashers=*/2);
  for (const TestFile* f : {&a, &b}) {
    for (uint64_t off = 0; off < f->bytes.size(); off += 50'000) {
      h.Offer(f->fd, off, f->bytes.data() + off, 50'000);
    }
  }
  auto digests = h.Finish();
  ASSERT_TRUE(digests.ok()) << digests.status();
  EXPECT_EQ((*digests)[0], "sha256:" + Sha256Hex(a.bytes));
  EXPECT_EQ((*digests)[1], "sha256:" + Sha256Hex(b.bytes));
  std::lock_guard<std::mutex> l(mu);
  EXPECT_TRUE(second_reported);
  EXPECT_FALSE(first_gave_up) << "file 1 was hashed only after file 0's report returned";
}

// Chunks offered through an O_DIRECT descriptor (a cold load's) wait for room in the hold
// rather than be left to Finish, whose read would go to storage a second time: with a hold
// of two chunks, a reader offering a file in order leaves nothing to read again.
TEST(FollowingSha256, OnePassAnODirectReaderWaitsForRoomInsteadOfLeavingAChunk) {
  DirectFile d;
  ASSERT_NO_FATAL_FAILURE(WriteDirect(d, 4'000'000, 8));
  if (d.direct < 0) GTEST_SKIP() << d.dir.path() << " refuses O_DIRECT: " << std::strerror(errno);
  const TestFile& a = d.f;
  const int direct = d.direct;
  FollowingSha256 h({{a.fd, a.bytes.size(), a.path}}, /*hold_bytes=*/2 * 65'536, nullptr);
  for (uint64_t off = 0; off < a.bytes.size(); off += 65'536) {
    h.Offer(direct, off, a.bytes.data() + off, 65'536);
  }
  auto digests = h.Finish();
  ASSERT_TRUE(digests.ok()) << digests.status();
  EXPECT_EQ((*digests)[0], "sha256:" + Sha256Hex(a.bytes));
  EXPECT_EQ(h.reread_bytes(), 0u);
  EXPECT_EQ(h.followed_bytes(), a.bytes.size());
}

// Found on the H100 (cold pinned llama-8g: 1.09 GB hashed from the load, 7.56 GB read again
// by the check, 1.88x the files read from storage): a chunk left because the hold was full
// was a gap the hash could never pass during the load, so every later chunk of that file was
// left too. Now the hasher reads a left chunk itself when its cursor reaches it: with chunk 2
// of a file left (the hold takes one chunk, chunk 1 holds it), the file is still hashed whole
// and reported during the load, before Finish.
TEST(FollowingSha256, OnePassAChunkLeftCostsThatChunkNotTheRestOfTheFile) {
  testing::TempDir dir;
  TestFile a;
  constexpr uint64_t kChunk = 65'536;
  ASSERT_NO_FATAL_FAILURE(Write(a, dir.path() + "/a", 40 * kChunk, 9));
  Reported r;
  FollowingSha256 h({{a.fd, a.bytes.size(), a.path}}, /*hold_bytes=*/kChunk, r.callback());
  auto offer = [&](uint64_t k) { h.Offer(a.fd, k * kChunk, a.bytes.data() + k * kChunk, kChunk); };
  offer(1);  // ahead: held (the hold is now full)
  offer(2);  // ahead, no room, through the page cache: left
  offer(0);  // at the cursor: taken
  for (uint64_t k = 3; k < 40; ++k) offer(k);
  EXPECT_TRUE(r.Wait()) << "the file was not hashed whole during the load";
  auto digests = h.Finish();
  ASSERT_TRUE(digests.ok()) << digests.status();
  EXPECT_EQ((*digests)[0], "sha256:" + Sha256Hex(a.bytes));
  EXPECT_EQ(h.followed_bytes() + h.reread_bytes(), a.bytes.size());
  EXPECT_GE(h.reread_bytes(), kChunk);  // chunk 2 at least, read by the hasher
}

// Found on the H100 after the gap fix (cold pinned llama-8g: still 1.15 GB hashed from the
// load and 7.5 GB read twice): an O_DIRECT reader that found the hold full left its chunk
// whenever no hash was moving at that instant, which is every time the cursor's own chunk is
// still being read by another worker. Now it waits: with the hold full of chunk 1 and chunk 0
// arriving late, chunk 2 is held, not left, and nothing is read twice.
TEST_F(FollowingSha256Direct, OnePassAnODirectChunkWaitsWhileTheCursorsChunkIsStillBeingRead) {
  ASSERT_NO_FATAL_FAILURE(Write(8, 11));
  if (IsSkipped()) return;
  // A stall far longer than this test: only the late chunk can make room.
  auto h = Follow(nullptr, std::chrono::seconds(60));
  Offer(*h, 1);                              // ahead: held, the hold is full
  std::thread ahead([&] { Offer(*h, 2); });  // ahead, no room, no hash moving
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  Offer(*h, 0);  // the cursor's chunk, late
  ahead.join();
  for (uint64_t k = 3; k < 8; ++k) Offer(*h, k);
  auto digests = h->Finish();
  ASSERT_TRUE(digests.ok()) << digests.status();
  EXPECT_EQ((*digests)[0], "sha256:" + Sha256Hex(bytes()));
  EXPECT_EQ(h->reread_bytes(), 0u) << "a chunk was left and read again";
  EXPECT_EQ(h->followed_bytes(), bytes().size());
  EXPECT_EQ(h->holes_filled(), 0u);
  EXPECT_GT(h->room_wait_seconds(), 0) << "chunk 2's reader waited for room: counted";
  EXPECT_GT(h->hash_seconds(), 0) << "offered chunks were hashed: the hashers' time counted";
}

// The same load, one step on: a reader waits for room with chunk 2 while the hold is full of
// chunk 3; chunks 0 and 1 arrive and are hashed, so the cursor reaches chunk 2 while its reader
// still waits. It is now the cursor's chunk and is taken (the hash waits for it, the hold
// cannot drain before it): nothing left, no hole read again, no stall.
TEST_F(FollowingSha256Direct, OnePassAWaitingChunkTheCursorReachesIsTaken) {
  ASSERT_NO_FATAL_FAILURE(Write(8, 13));
  if (IsSkipped()) return;
  auto h = Follow(nullptr, std::chrono::seconds(2));
  Offer(*h, 3);                                // ahead: held, the hold is full
  std::thread waiting([&] { Offer(*h, 2); });  // ahead, no room: waits
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  Offer(*h, 0);  // at the cursor
  Offer(*h, 1);  // at the cursor once 0 is hashed, or held beside it: either way hashed next
  const auto t0 = std::chrono::steady_clock::now();
  waiting.join();
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (uint64_t k = 4; k < 8; ++k) Offer(*h, k);
  auto digests = h->Finish();
  ASSERT_TRUE(digests.ok()) << digests.status();
  EXPECT_EQ((*digests)[0], "sha256:" + Sha256Hex(bytes()));
  EXPECT_EQ(h->reread_bytes(), 0u) << "chunk 2 was left or its hole read again";
  EXPECT_EQ(h->holes_filled(), 0u);
  EXPECT_LT(waited, 2.0) << "chunk 2 waited for the stall, not for the cursor";
}

// A range no reader reads (a lone rank's load skips other ranks' shards) under O_DIRECT: the
// readers fill the hold and wait; once no hash has moved for the stall, the file's hasher
// reads the hole itself and goes on with what it holds, so the file is hashed whole during
// the load and only the hole is read twice (before: every later chunk was left and the file
// waited for Finish).
TEST_F(FollowingSha256Direct, OnePassARangeNoReaderReadsIsReadByItsHasherDuringTheLoad) {
  ASSERT_NO_FATAL_FAILURE(Write(16, 12));
  if (IsSkipped()) return;
  Reported r;
  auto h = Follow(r.callback(), std::chrono::milliseconds(20));
  for (uint64_t k = 1; k < 16; ++k) Offer(*h, k);  // chunk 0 is never offered
  EXPECT_TRUE(r.Wait()) << "the file was not hashed whole during the load";
  auto digests = h->Finish();
  ASSERT_TRUE(digests.ok()) << digests.status();
  EXPECT_EQ((*digests)[0], "sha256:" + Sha256Hex(bytes()));
  EXPECT_EQ(h->reread_bytes(), kChunk) << "only the hole is read by the check";
  EXPECT_EQ(h->followed_bytes(), 15 * kChunk);
  EXPECT_GE(h->holes_filled(), 1u);
}

// A file cut short under the check: the read for the digest names the file and where.
TEST(FollowingSha256, ATruncatedFileIsNamed) {
  testing::TempDir dir;
  TestFile a;
  ASSERT_NO_FATAL_FAILURE(Write(a, dir.path() + "/a", 10'000, 4));
  FollowingSha256 h({{a.fd, 20'000, a.path}}, 0, nullptr);  // it was longer when opened
  auto digests = h.Finish();
  ASSERT_FALSE(digests.ok());
  EXPECT_EQ(digests.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(digests.status().message().find(a.path + ": read for its SHA-256 at byte 10000 of "
                                                     "20000: the file ended"),
            std::string::npos)
      << digests.status();
}

}  // namespace
}  // namespace weightcache::identity
