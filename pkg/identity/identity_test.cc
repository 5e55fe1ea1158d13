#include "pkg/identity/identity.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "pkg/util/scoped_fd.h"
#include "tests/testutil/temp_dir.h"

namespace weightcache::identity {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;
using weightcache::testing::TempDir;

std::string Bytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string s(n, '\0');
  for (auto& c : s) c = static_cast<char>(rng());
  return s;
}

std::string Read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void Write(const std::string& path, const std::string& data) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << data;
}

std::string Digest(const std::string& path, unsigned threads = 4) {
  ScopedFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  EXPECT_TRUE(fd.valid());
  auto size = StatFd(fd.get(), path);
  EXPECT_TRUE(size.ok());
  auto d = HashFile(fd.get(), size->size, threads, path);
  EXPECT_TRUE(d.ok()) << d.status();
  return d.ok() ? *d : "";
}

TEST(HashFileTest, ContentDecidesAndThreadsDoNot) {
  TempDir dir;
  // Two 64 MiB chunks and a tail: the parallel and serial digests must agree.
  std::string data = Bytes((130u << 20) + 12345, 1);
  Write(dir / "a", data);
  data[(100u << 20) + 7] ^= 1;  // one bit in the second chunk
  Write(dir / "b", data);
  const std::string a1 = Digest(dir / "a", 1);
  EXPECT_THAT(a1, StartsWith("sha256c:"));  // cryptographic: the identity spans tenants
  EXPECT_EQ(a1.size(), 8u + 64u);
  EXPECT_EQ(a1, Digest(dir / "a", 8));
  EXPECT_NE(a1, Digest(dir / "b", 8));
}

TEST(HashFileTest, SizeIsPartOfTheDigest) {
  TempDir dir;
  Write(dir / "empty", "");
  Write(dir / "zero", std::string(1, '\0'));
  EXPECT_NE(Digest(dir / "empty"), Digest(dir / "zero"));
}

TEST(HashFileTest, ShortFileIsDataLoss) {
  TempDir dir;
  Write(dir / "a", "abc");
  ScopedFd fd(::open((dir / "a").c_str(), O_RDONLY | O_CLOEXEC));
  auto d = HashFile(fd.get(), 10, 2, "a.safetensors");
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(d.status().message(), HasSubstr("a.safetensors: ends at byte 3"));
}

TEST(DescribeChangeTest, EveryKindOfChangeIsNamed) {
  TempDir dir;
  const std::string p = dir / "model.safetensors";
  Write(p, "0123456789");
  auto before = StatPath(p);
  ASSERT_TRUE(before.ok());
  EXPECT_EQ(DescribeChange("model.safetensors", *before, StatPath(p)), "");

  // Rewritten in place, same size, mtime set back: only the ctime tells.
  usleep(20000);
  {
    std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(3);
    f.put('X');
  }
  struct timespec times[2] = {{0, UTIME_OMIT},
                              {before->mtime_ns / 1000000000, before->mtime_ns % 1000000000}};
  ASSERT_EQ(::utimensat(AT_FDCWD, p.c_str(), times, 0), 0);
  auto now = StatPath(p);
  ASSERT_TRUE(now.ok());
  EXPECT_EQ(now->mtime_ns, before->mtime_ns);
  EXPECT_THAT(DescribeChange("model.safetensors", *before, now),
              StartsWith("model.safetensors: rewritten in place (changed 20"));

  // Truncated.
  ASSERT_EQ(::truncate(p.c_str(), 4), 0);
  EXPECT_THAT(DescribeChange("model.safetensors", *before, StatPath(p)),
              HasSubstr("size 10 -> 4, modified 20"));

  // Replaced by another file (rename over it).
  Write(dir / "new", "0123456789");
  ASSERT_EQ(::rename((dir / "new").c_str(), p.c_str()), 0);
  EXPECT_THAT(DescribeChange("model.safetensors", *before, StatPath(p)),
              HasSubstr("replaced by another file (inode "));

  // Deleted.
  ASSERT_EQ(::unlink(p.c_str()), 0);
  EXPECT_EQ(DescribeChange("model.safetensors", *before, StatPath(p)),
            "model.safetensors: deleted");
}

TEST(HuggingFaceBlobTest, SnapshotLinkToBlobIsNamedByItsSha256) {
  TempDir dir;
  const std::string hex(64, 'a');
  std::filesystem::create_directories(dir / "blobs");
  std::filesystem::create_directories(dir / "snapshots/rev");
  Write(dir / ("blobs/" + hex), "weights");
  std::filesystem::create_symlink("../../blobs/" + hex, dir / "snapshots/rev/model.safetensors");
  EXPECT_EQ(HuggingFaceBlobDigest(dir / "snapshots/rev/model.safetensors"), "sha256:" + hex);
  // A plain file, or a blob-like name elsewhere, is not trusted.
  Write(dir / "plain.safetensors", "weights");
  EXPECT_EQ(HuggingFaceBlobDigest(dir / "plain.safetensors"), std::nullopt);
  Write(dir / hex, "weights");
  EXPECT_EQ(HuggingFaceBlobDigest(dir / hex), std::nullopt);
  EXPECT_EQ(HuggingFaceBlobDigest(dir / "missing"), std::nullopt);
}

TEST(DigestStoreTest, ResolveHashesOnceAndSurvivesARestart) {
  TempDir dir;
  const std::string p = dir / "model.safetensors";
  Write(p, Bytes(1 << 20, 2));
  const std::string state = dir / "digests.json";
  std::string first;
  {
    auto store = DigestStore::Open(state);
    ASSERT_TRUE(store.ok()) << store.status();
    ScopedFd fd(::open(p.c_str(), O_RDONLY | O_CLOEXEC));
    auto r = (*store)->Resolve(p, fd.get());
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->source, DigestSource::kHashed);
    EXPECT_EQ((*store)->hashed_bytes(), 1u << 20);
    first = r->digest;
    auto again = (*store)->Resolve(p, fd.get());
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(again->source, DigestSource::kStore);
    EXPECT_EQ((*store)->hashed_bytes(), 1u << 20);
  }
  // A new store over the same file: nothing hashed.
  auto store = DigestStore::Open(state);
  ASSERT_TRUE(store.ok());
  EXPECT_EQ((*store)->size(), 1u);
  ScopedFd fd(::open(p.c_str(), O_RDONLY | O_CLOEXEC));
  auto r = (*store)->Resolve(p, fd.get());
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->source, DigestSource::kStore);
  EXPECT_EQ(r->digest, first);
  EXPECT_EQ((*store)->hashed_bytes(), 0u);

  // Rewritten in place with the same bytes but a new version: hashed again, same digest.
  Write(p, Bytes(1 << 20, 2));
  ScopedFd fd2(::open(p.c_str(), O_RDONLY | O_CLOEXEC));
  auto r2 = (*store)->Resolve(p, fd2.get());
  ASSERT_TRUE(r2.ok());
  EXPECT_EQ(r2->source, DigestSource::kHashed);
  EXPECT_EQ(r2->digest, first);
}

TEST(Sha256FileTest, IsThePlainSha256OfTheBytes) {
  TempDir dir;
  Write(dir / "abc", "abc");
  ScopedFd fd(::open((dir / "abc").c_str(), O_RDONLY | O_CLOEXEC));
  auto d = Sha256File(fd.get(), 3, "abc");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(*d, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");  // FIPS 180-2
}

// Past 8 MiB the reads run ahead of the hash in a ring of six 8 MiB chunks (sha256_file.cc):
// at sizes around a chunk's and the ring's bounds, the digest is the SHA-256 of the bytes in
// order (a chunk hashed out of order or a slot written while hashed would change it).
TEST(Sha256FileTest, ReadAheadHashesEveryByteInOrderAtEverySize) {
  constexpr size_t kChunk = 8u << 20;
  TempDir dir;
  const std::string all = Bytes(7 * kChunk + 5, 11);
  Write(dir / "f", all);
  ScopedFd fd(::open((dir / "f").c_str(), O_RDONLY | O_CLOEXEC));
  for (size_t n : {size_t{0}, size_t{1}, kChunk - 1, kChunk, kChunk + 1, 6 * kChunk, 6 * kChunk + 3,
                   7 * kChunk + 5}) {
    auto d = Sha256File(fd.get(), n, "f");
    ASSERT_TRUE(d.ok()) << n << ": " << d.status();
    EXPECT_EQ(*d, Sha256Hex(std::string_view(all).substr(0, n))) << n << " bytes";
  }
}

TEST(Sha256FileTest, AFileShorterThanItsSizeIsDataLossNamingTheByte) {
  constexpr size_t kChunk = 8u << 20;
  TempDir dir;
  Write(dir / "short", Bytes(3 * kChunk + 7, 12));
  ScopedFd fd(::open((dir / "short").c_str(), O_RDONLY | O_CLOEXEC));
  auto d = Sha256File(fd.get(), 5 * kChunk, "short.safetensors");
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(d.status().message()),
              HasSubstr("short.safetensors: ends at byte " + std::to_string(3 * kChunk + 7) +
                        ", expected " + std::to_string(5 * kChunk) + " bytes"));
  auto unreadable = Sha256File(-1, 5 * kChunk, "gone.safetensors");
  ASSERT_FALSE(unreadable.ok());
  EXPECT_THAT(std::string(unreadable.status().message()), HasSubstr("gone.safetensors"));
}

TEST(Sha256FileTest, ACancelledHashStopsWithCancelled) {
  TempDir dir;
  Write(dir / "f", Bytes(20u << 20, 13));
  ScopedFd fd(::open((dir / "f").c_str(), O_RDONLY | O_CLOEXEC));
  const std::atomic<bool> cancel{true};
  auto d = Sha256File(fd.get(), 20u << 20, "f", &cancel);
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), absl::StatusCode::kCancelled) << d.status();
}

// Finding (issue 25): a file whose link target was named blobs/<64 hex> got the digest
// sha256:<that name> without a byte read, so anyone writing a model directory could name
// poisoned bytes after another team's public model. The name is now verified.
TEST(DigestStoreTest, ABlobNameIsVerifiedAgainstItsBytes) {
  TempDir dir;
  std::filesystem::create_directories(dir / "blobs");
  std::filesystem::create_directories(dir / "snapshots/rev");
  const std::string real = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
  Write(dir / ("blobs/" + real), "abc");
  std::filesystem::create_symlink("../../blobs/" + real, dir / "snapshots/rev/good.safetensors");
  const std::string forged(64, 'b');
  Write(dir / ("blobs/" + forged), "poisoned bytes");
  std::filesystem::create_symlink("../../blobs/" + forged, dir / "snapshots/rev/bad.safetensors");
  auto store = DigestStore::Open("");
  ASSERT_TRUE(store.ok());
  const std::string good = dir / "snapshots/rev/good.safetensors";
  ScopedFd g(::open(good.c_str(), O_RDONLY | O_CLOEXEC));
  auto r = (*store)->Resolve(good, g.get());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->digest, "sha256:" + real);
  EXPECT_EQ(r->source, DigestSource::kBlobName);
  EXPECT_EQ((*store)->hashed_bytes(), 3u);        // verified by reading it
  auto again = (*store)->Resolve(good, g.get());  // once per file version
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->source, DigestSource::kStore);
  const std::string bad = dir / "snapshots/rev/bad.safetensors";
  ScopedFd b(::open(bad.c_str(), O_RDONLY | O_CLOEXEC));
  auto forgery = (*store)->Resolve(bad, b.get());
  EXPECT_EQ(forgery.status().code(), absl::StatusCode::kDataLoss) << forgery.status();
  EXPECT_THAT(std::string(forgery.status().message()),
              HasSubstr("bad.safetensors: its Hugging Face blob name says sha256:bbbb"));
  EXPECT_THAT(std::string(forgery.status().message()), HasSubstr("refused"));
}

// A store written by an earlier daemon holds non-cryptographic digests (xxh3c:): they are
// not trusted as identity, the file is hashed again.
TEST(DigestStoreTest, NonCryptographicDigestsOfAnOldStoreAreHashedAgain) {
  TempDir dir;
  const std::string p = dir / "model.safetensors";
  Write(p, Bytes(4096, 3));
  auto st = StatPath(p);
  ASSERT_TRUE(st.ok());
  {
    auto store = DigestStore::Open(dir / "digests.json");
    ASSERT_TRUE(store.ok());
    (*store)->Record(*st, "xxh3c:00112233445566778899aabbccddeeff");
  }
  auto store = DigestStore::Open(dir / "digests.json");
  ASSERT_TRUE(store.ok());
  ScopedFd fd(::open(p.c_str(), O_RDONLY | O_CLOEXEC));
  auto r = (*store)->Resolve(p, fd.get());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->source, DigestSource::kHashed);
  EXPECT_EQ(r->digest, "sha256:" + Sha256Hex(Bytes(4096, 3)));
}

// Issue 48: a file is named by its plain SHA-256, what `sha256sum` prints and a spec pins,
// whoever computed it. A store entry of the chunked kind used before ("sha256c:", which
// nothing outside the daemon computes) is hashed again, once per file version.
TEST(DigestStoreTest, HashingGivesThePlainSha256AndChunkedDigestsAreHashedAgain) {
  TempDir dir;
  const std::string p = dir / "model.safetensors";
  const std::string bytes = Bytes(3 << 20, 4);
  Write(p, bytes);
  auto st = StatPath(p);
  ASSERT_TRUE(st.ok());
  ScopedFd fd(::open(p.c_str(), O_RDONLY | O_CLOEXEC));
  auto chunked = HashFile(fd.get(), st->size, 2, p);
  ASSERT_TRUE(chunked.ok());
  {
    auto store = DigestStore::Open(dir / "digests.json");
    ASSERT_TRUE(store.ok());
    (*store)->Record(*st, *chunked);
  }
  auto store = DigestStore::Open(dir / "digests.json");
  ASSERT_TRUE(store.ok());
  auto r = (*store)->Resolve(p, fd.get());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->source, DigestSource::kHashed);
  EXPECT_EQ(r->digest, "sha256:" + Sha256Hex(bytes));
  EXPECT_EQ((*store)->hashed_bytes(), bytes.size());
  auto again = (*store)->Resolve(p, fd.get());
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->source, DigestSource::kStore);
  EXPECT_EQ(again->digest, r->digest);
  EXPECT_EQ((*store)->hashed_bytes(), bytes.size());
}

// Writes a 4 KiB file at `p` and records its digest in a store persisted at `state`.
void StoreOneDigest(const std::string& p, const std::string& state) {
  Write(p, Bytes(4096, 5));
  auto store = DigestStore::Open(state);
  ASSERT_TRUE(store.ok()) << store.status();
  ScopedFd fd(::open(p.c_str(), O_RDONLY | O_CLOEXEC));
  ASSERT_TRUE((*store)->Resolve(p, fd.get()).ok());
}

// Finding (issue 25): the digest store was trusted at start with no integrity check, so
// whoever could write it assigned any digest to any file version (a poisoned file then
// took another model's identity without a byte read). Its entries now carry an HMAC under
// a key only the daemon's uid reads; an edited store is discarded and the file hashed.
// Bytes this process has read with read(2) and pread(2), page cache included.
uint64_t ReadChars() {
  std::ifstream io("/proc/self/io");
  std::string key;
  uint64_t value = 0;
  while (io >> key >> value) {
    if (key == "rchar:") return value;
  }
  return 0;
}

// A writer of the model directory rewrites a file's first and last bytes while its first sight
// is hashed
// (by Sha256File's readers, ahead of the hash): the digest taken is never one of bytes that
// were in the file at no moment. Either the write is caught (UNAVAILABLE naming the file: its
// stat moved while it was hashed) or the digest is of one whole version, before or after.
TEST(DigestStoreTest, AFileWrittenWhileItsFirstSightIsHashedIsRefusedOrHashedWhole) {
  TempDir dir;
  const std::string p = dir / "model.safetensors";
  const std::string before = Bytes(96u << 20, 21);
  std::string after = before;
  after.front() = static_cast<char>(after.front() ^ 1);
  after.back() = static_cast<char>(after.back() ^ 1);
  Write(p, before);
  auto store = DigestStore::Open("");
  ASSERT_TRUE(store.ok());
  ScopedFd fd(::open(p.c_str(), O_RDONLY | O_CLOEXEC));
  // The writer waits until this process has read the file's first 8 MiB chunk (its read
  // count, /proc/self/io rchar): the hash has the old first byte, and the last chunk is beyond
  // the readers' 48 MiB ring, so without the stat check the digest would be of a mix.
  const uint64_t rchar0 = ReadChars();
  std::thread writer([&] {
    while (ReadChars() < rchar0 + (8u << 20)) std::this_thread::yield();
    ScopedFd w(::open(p.c_str(), O_WRONLY | O_CLOEXEC));
    ASSERT_EQ(::pwrite(w.get(), &after.front(), 1, 0), 1);
    ASSERT_EQ(::pwrite(w.get(), &after.back(), 1, static_cast<off_t>(after.size() - 1)), 1);
  });
  auto r = (*store)->Resolve(p, fd.get());
  writer.join();
  if (r.ok()) {
    EXPECT_THAT(r->digest,
                ::testing::AnyOf("sha256:" + Sha256Hex(before), "sha256:" + Sha256Hex(after)));
  } else {
    EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
    EXPECT_THAT(std::string(r.status().message()), HasSubstr("model.safetensors"));
    EXPECT_THAT(std::string(r.status().message()), HasSubstr("while it was hashed"));
  }
}

TEST(DigestStoreTest, ATamperedStoreIsDiscardedAndTheFileHashedAgain) {
  TempDir dir;
  const std::string p = dir / "model.safetensors";
  const std::string state = dir / "digests.json";
  ASSERT_NO_FATAL_FAILURE(StoreOneDigest(p, state));
  struct stat key {};
  ASSERT_EQ(::stat((state + ".key").c_str(), &key), 0);
  EXPECT_EQ(key.st_mode & 0777, 0600u);
  // The attacker's edit: this file version now claims another model's digest.
  const std::string forged = "sha256:" + std::string(64, 'a');
  auto j = nlohmann::json::parse(Read(state));
  j["entries"][0]["digest"] = forged;
  Write(state, j.dump());
  ::testing::internal::CaptureStderr();
  auto store = DigestStore::Open(state);
  const std::string log = ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ((*store)->size(), 0u);
  EXPECT_THAT(log, HasSubstr("HMAC does not match"));
  EXPECT_TRUE(std::filesystem::exists(state + ".bad"));
  ScopedFd fd(::open(p.c_str(), O_RDONLY | O_CLOEXEC));
  auto r = (*store)->Resolve(p, fd.get());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->source, DigestSource::kHashed);
  EXPECT_NE(r->digest, forged);
}

// A key others may read is no secret: replaced, and what it signed is discarded.
TEST(DigestStoreTest, AKeyOthersCanReadIsReplaced) {
  TempDir dir;
  const std::string p = dir / "model.safetensors";
  const std::string state = dir / "digests.json";
  ASSERT_NO_FATAL_FAILURE(StoreOneDigest(p, state));
  const std::string old_key = Read(state + ".key");
  ASSERT_EQ(::chmod((state + ".key").c_str(), 0644), 0);
  ::testing::internal::CaptureStderr();
  auto store = DigestStore::Open(state);
  const std::string log = ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_THAT(log, HasSubstr("replacing it"));
  EXPECT_EQ((*store)->size(), 0u);
  EXPECT_NE(Read(state + ".key"), old_key);
  struct stat key {};
  ASSERT_EQ(::stat((state + ".key").c_str(), &key), 0);
  EXPECT_EQ(key.st_mode & 0777, 0600u);
}

TEST(DigestStoreTest, UnreadableStateIsSetAsideNotFatal) {
  TempDir dir;
  Write(dir / "digests.json", "{not json");
  auto store = DigestStore::Open(dir / "digests.json");
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ((*store)->size(), 0u);
  EXPECT_TRUE(std::filesystem::exists(dir / "digests.json.bad"));
}

}  // namespace
}  // namespace weightcache::identity
