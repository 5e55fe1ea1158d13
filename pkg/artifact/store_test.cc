#include "pkg/artifact/store.h"

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <thread>

namespace weightcache::artifact {
namespace {

Key MakeKey(const std::string& kind = "torch-compile") {
  Key k;
  k.kind = kind;
  k.model = "llama";
  k.fingerprint = "wc1-abc";
  k.torch_version = "2.11.0";
  k.compute_capability = "9.0";
  k.settings_hash = "s1";
  return k;
}

std::string Read(const Artifact& a) {
  std::string out(a.bytes(), '\0');
  EXPECT_EQ(::pread(a.fd(), out.data(), out.size(), 0), static_cast<ssize_t>(out.size()));
  return out;
}

std::shared_ptr<const Artifact> Put(Store& s, const Key& k, const std::string& bytes) {
  auto slot = s.BeginPut(k, bytes.size());
  EXPECT_TRUE(slot.ok()) << slot.status();
  if (!slot.ok()) return nullptr;
  EXPECT_TRUE((*slot)->Append(bytes).ok());
  auto a = (*slot)->Commit(Publisher{.pid = 7, .uid = 1000, .slot = "", .unix_seconds = 0});
  EXPECT_TRUE(a.ok()) << a.status();
  return a.ok() ? *a : nullptr;
}

class TempDir {
 public:
  TempDir() {
    char t[] = "/tmp/wc-artifact-XXXXXX";
    path_ = ::mkdtemp(t);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

TEST(ArtifactStore, PutThenGetServesTheSameBytesSealed) {
  auto s = Store::Open({});
  ASSERT_TRUE(s.ok());
  auto put = Put(**s, MakeKey(), "compiled kernels");
  ASSERT_NE(put, nullptr);
  auto got = (*s)->Get(MakeKey());
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(Read(**got), "compiled kernels");
  EXPECT_EQ((*got)->sha256().size(), 64u);
  EXPECT_EQ((*got)->publisher().uid, 1000u);
  // Read-only descriptor of a sealed memfd: no writable mapping, no write, no resize, even
  // through a fresh open of the same file.
  EXPECT_EQ(::mmap(nullptr, 16, PROT_READ | PROT_WRITE, MAP_SHARED, (*got)->fd(), 0), MAP_FAILED);
  EXPECT_LT(::pwrite((*got)->fd(), "x", 1, 0), 0);
  const std::string self = "/proc/self/fd/" + std::to_string((*got)->fd());
  const int rw = ::open(self.c_str(), O_RDWR);
  if (rw >= 0) {
    EXPECT_LT(::pwrite(rw, "x", 1, 0), 0) << "sealed against writes";
    EXPECT_NE(::ftruncate(rw, 1), 0) << "sealed against shrinking";
    ::close(rw);
  }
  void* ro = ::mmap(nullptr, 16, PROT_READ, MAP_SHARED, (*got)->fd(), 0);
  ASSERT_NE(ro, MAP_FAILED);
  EXPECT_EQ(std::string(static_cast<const char*>(ro), 16), "compiled kernels");
  ::munmap(ro, 16);
}

TEST(ArtifactStore, EveryKeyFieldSeparatesArtifacts) {
  auto s = Store::Open({});
  ASSERT_TRUE(s.ok());
  ASSERT_NE(Put(**s, MakeKey(), "a"), nullptr);
  Key other = MakeKey();
  other.tenant = "team-a";
  EXPECT_EQ((*s)->Get(other).status().code(), absl::StatusCode::kNotFound);
  other = MakeKey();
  other.settings_hash = "s2";
  EXPECT_EQ((*s)->Get(other).status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(IdOf(MakeKey()), IdOf(other));
  // Length-prefixed: moving a character between fields changes the id.
  Key a = MakeKey(), b = MakeKey();
  a.engine = "ab";
  a.engine_version = "c";
  b.engine = "a";
  b.engine_version = "bc";
  EXPECT_NE(IdOf(a), IdOf(b));
}

TEST(ArtifactStore, BadKeysAndSizesNameWhatIsWrong) {
  auto s = Store::Open({.budget_bytes = 100, .max_artifact_bytes = 50, .dir = ""});
  ASSERT_TRUE(s.ok());
  Key k = MakeKey();
  k.fingerprint.clear();
  auto r = (*s)->BeginPut(k, 10);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("'fingerprint' is required"), std::string::npos);
  k = MakeKey();
  k.engine = "has space";
  r = (*s)->BeginPut(k, 10);
  EXPECT_NE(r.status().message().find("'engine'"), std::string::npos) << r.status();
  r = (*s)->BeginPut(MakeKey(), 51);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("--artifact_max_bytes"), std::string::npos);
  r = (*s)->BeginPut(MakeKey(), 0);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  // More or fewer bytes than declared: refused, nothing stored.
  auto slot = (*s)->BeginPut(MakeKey(), 4);
  ASSERT_TRUE(slot.ok());
  EXPECT_EQ((*slot)->Append("12345").code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE((*slot)->Append("123").ok());
  EXPECT_EQ((*slot)->Commit({}).status().code(), absl::StatusCode::kFailedPrecondition);
  slot->reset();
  EXPECT_EQ((*s)->Get(MakeKey()).status().code(), absl::StatusCode::kNotFound);
}

TEST(ArtifactStore, OnePutPerKeyAndAnAbandonedPutLeavesNothing) {
  auto s = Store::Open({});
  ASSERT_TRUE(s.ok());
  auto first = (*s)->BeginPut(MakeKey(), 3);
  ASSERT_TRUE(first.ok());
  EXPECT_EQ((*s)->BeginPut(MakeKey(), 3).status().code(), absl::StatusCode::kAborted);
  ASSERT_TRUE((*first)->Append("ab").ok());
  // A reader meanwhile: no torn blob, ever. Without waiting: not found.
  EXPECT_EQ((*s)->Get(MakeKey()).status().code(), absl::StatusCode::kNotFound);
  first->reset();  // the writer went away
  EXPECT_EQ((*s)->Get(MakeKey()).status().code(), absl::StatusCode::kNotFound);
  auto again = (*s)->BeginPut(MakeKey(), 3);
  ASSERT_TRUE(again.ok()) << again.status();
  ASSERT_TRUE((*again)->Append("abc").ok());
  ASSERT_TRUE((*again)->Commit({}).ok());
  EXPECT_EQ((*s)->BeginPut(MakeKey(), 3).status().code(), absl::StatusCode::kAlreadyExists);
}

TEST(ArtifactStore, AWaitingReaderGetsThePutWhenItCommits) {
  auto s = Store::Open({});
  ASSERT_TRUE(s.ok());
  auto slot = (*s)->BeginPut(MakeKey(), 5);
  ASSERT_TRUE(slot.ok());
  absl::StatusOr<std::shared_ptr<const Artifact>> got = absl::UnknownError("not run");
  std::thread reader([&] {
    got = (*s)->Get(MakeKey(), true, std::chrono::steady_clock::now() + std::chrono::seconds(30));
  });
  ASSERT_TRUE((*slot)->Append("hello").ok());
  ASSERT_TRUE((*slot)->Commit({}).ok());
  reader.join();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(Read(**got), "hello");
  // A wait for a put that never commits ends at the deadline, naming it.
  Key k = MakeKey("triton-cache");
  auto stuck = (*s)->BeginPut(k, 5);
  ASSERT_TRUE(stuck.ok());
  auto late = (*s)->Get(k, true, std::chrono::steady_clock::now() + std::chrono::milliseconds(50));
  EXPECT_EQ(late.status().code(), absl::StatusCode::kDeadlineExceeded);
}

TEST(ArtifactStore, TheBudgetEvictsTheLeastRecentlyUsed) {
  auto s = Store::Open({.budget_bytes = 10, .max_artifact_bytes = 10, .dir = ""});
  ASSERT_TRUE(s.ok());
  ASSERT_NE(Put(**s, MakeKey("a"), "aaaa"), nullptr);
  auto b = Put(**s, MakeKey("b"), "bbbb");
  ASSERT_NE(b, nullptr);
  ASSERT_TRUE((*s)->Get(MakeKey("a")).ok());  // a is now the more recently used
  ASSERT_NE(Put(**s, MakeKey("c"), "cccc"), nullptr);
  EXPECT_TRUE((*s)->Get(MakeKey("a")).ok());
  EXPECT_EQ((*s)->Get(MakeKey("b")).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(Read(*b), "bbbb") << "a reader's descriptor outlives the eviction";
  EXPECT_EQ((*s)->usage().resident_bytes, 8u);
  EXPECT_EQ((*s)->usage().evictions, 1u);
  EXPECT_EQ((*s)->BeginPut(MakeKey("d"), 11).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE((*s)->Evict(IdOf(MakeKey("a"))));
  EXPECT_FALSE((*s)->Evict(IdOf(MakeKey("a"))));
  EXPECT_EQ((*s)->usage().resident_bytes, 4u);
}

TEST(ArtifactStore, ADirectoryKeepsThemAcrossARestart) {
  TempDir dir;
  std::string id;
  {
    auto s = Store::Open({.dir = dir.path()});
    ASSERT_TRUE(s.ok()) << s.status();
    auto a = Put(**s, MakeKey(), "survives");
    ASSERT_NE(a, nullptr);
    id = a->id();
  }
  auto s = Store::Open({.dir = dir.path()});
  ASSERT_TRUE(s.ok());
  auto list = (*s)->List();
  ASSERT_EQ(list.size(), 1u);
  EXPECT_TRUE(list[0].on_disk);
  EXPECT_FALSE(list[0].resident);
  EXPECT_EQ(list[0].publisher.pid, 7);
  auto got = (*s)->Get(MakeKey());
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(Read(**got), "survives");
  EXPECT_EQ((*got)->id(), id);
  // Evicted by an admin: gone from the directory too.
  EXPECT_TRUE((*s)->Evict(id));
  auto reopened = Store::Open({.dir = dir.path()});
  ASSERT_TRUE(reopened.ok());
  EXPECT_TRUE((*reopened)->List().empty());
}

TEST(ArtifactStore, ADamagedFileOnDiskIsCaughtAndSetAside) {
  TempDir dir;
  std::string id;
  {
    auto s = Store::Open({.dir = dir.path()});
    ASSERT_TRUE(s.ok());
    auto a = Put(**s, MakeKey(), "original");
    ASSERT_NE(a, nullptr);
    id = a->id();
  }
  {
    std::fstream f(dir.path() + "/" + id + ".blob", std::ios::in | std::ios::out);
    f.seekp(0);
    f << "X";  // same size, other bytes
  }
  std::ofstream(dir.path() + "/garbage.json") << "{not json";
  auto s = Store::Open({.dir = dir.path()});
  ASSERT_TRUE(s.ok()) << "an unreadable file is skipped, not fatal";
  auto got = (*s)->Get(MakeKey());
  EXPECT_EQ(got.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(got.status().message().find("SHA-256"), std::string::npos) << got.status();
  EXPECT_TRUE(std::filesystem::exists(dir.path() + "/" + id + ".blob.bad"));
  EXPECT_EQ((*s)->Get(MakeKey()).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(std::filesystem::exists(dir.path() + "/garbage.json")) << "left in place";
}

}  // namespace
// What the keeper gives back after a daemon restart (issue 29: artifacts survive a restart
// through the keeper): a record and a descriptor. Taken only when the descriptor is a sealed
// memfd of the record's size whose bytes hash to the record's digest; the observer hears of
// every artifact that enters or leaves memory (the keeper link's cue).
TEST(ArtifactStore, AdoptTakesBackOnlyASealedMemfdWithTheRecordsBytes) {
  auto from = Store::Open({});
  ASSERT_TRUE(from.ok());
  auto put = Put(**from, MakeKey(), "compiled kernels");
  ASSERT_NE(put, nullptr);
  auto record = DecodeRecord(EncodeRecord(*put));
  ASSERT_TRUE(record.ok()) << record.status();
  EXPECT_EQ(record->id, put->id());
  EXPECT_EQ(record->publisher.pid, 7);

  auto to = Store::Open({.budget_bytes = 20, .max_artifact_bytes = 20, .dir = ""});
  ASSERT_TRUE(to.ok());
  std::vector<std::string> heard;
  (*to)->SetObserver([&heard](const std::string& id) { heard.push_back(id); });
  auto dup = [](int fd) { return ScopedFd(::fcntl(fd, F_DUPFD_CLOEXEC, 0)); };

  // An unsealed memfd with the right bytes: refused (anyone holding it could change them).
  ScopedFd open_fd(::memfd_create("unsealed", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  ASSERT_EQ(::pwrite(open_fd.get(), "compiled kernels", 16, 0), 16);
  auto unsealed = (*to)->Adopt(std::move(open_fd), *record);
  EXPECT_EQ(unsealed.status().code(), absl::StatusCode::kFailedPrecondition) << unsealed.status();
  // A record whose digest is not the descriptor's bytes: refused, named.
  auto wrong = *record;
  wrong.sha256 = std::string(64, '0');
  auto mismatch = (*to)->Adopt(dup(put->fd()), wrong);
  EXPECT_EQ(mismatch.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(std::string(mismatch.status().message()).find(put->id()), std::string::npos);
  auto longer = *record;
  longer.bytes = 17;
  EXPECT_EQ((*to)->Adopt(dup(put->fd()), longer).status().code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(heard.empty());

  auto adopted = (*to)->Adopt(dup(put->fd()), *record);
  ASSERT_TRUE(adopted.ok()) << adopted.status();
  EXPECT_EQ(Read(**adopted), "compiled kernels");
  EXPECT_EQ((*adopted)->publisher().uid, 1000u);
  EXPECT_EQ((*to)->InMemory(put->id()), *adopted);
  EXPECT_EQ((*to)->Adopt(dup(put->fd()), *record).status().code(),
            absl::StatusCode::kAlreadyExists);
  ASSERT_EQ(heard, std::vector<std::string>{put->id()});
  auto got = (*to)->Get(MakeKey());
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(*got, *adopted);

  // A put past the 20-byte budget drops the adopted one from memory: both are heard.
  auto other = Put(**to, MakeKey("triton-cache"), "more kernels");
  ASSERT_NE(other, nullptr);
  EXPECT_EQ(heard, (std::vector<std::string>{put->id(), put->id(), other->id()}));
  EXPECT_EQ((*to)->InMemory(put->id()), nullptr);
  EXPECT_TRUE((*to)->Evict(other->id()));
  EXPECT_EQ(heard.back(), other->id());
  EXPECT_TRUE((*to)->ResidentArtifacts().empty());
}

TEST(ArtifactStore, ABadRecordIsRefusedNamingWhatIsWrong) {
  auto s = Store::Open({});
  ASSERT_TRUE(s.ok());
  auto put = Put(**s, MakeKey(), "compiled kernels");
  ASSERT_NE(put, nullptr);
  std::string text = EncodeRecord(*put);
  EXPECT_EQ(DecodeRecord("not json").status().code(), absl::StatusCode::kInvalidArgument);
  // Another key under the same id: the id is the key's hash, so this is caught.
  const auto pos = text.find("\"llama\"");
  ASSERT_NE(pos, std::string::npos);
  std::string other_model = text;
  other_model.replace(pos, 7, "\"other\"");
  auto bad = DecodeRecord(other_model);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(bad.status().message()).find("is not its key's"), std::string::npos)
      << bad.status();
}

constexpr uint64_t kMiB = 1 << 20;

// Issue 47, finding 4: eight puts that each declared 60 MiB and trickled a byte at a time
// were all begun against a 100 MiB budget (472 MiB held; the store counted 1,020 bytes
// resident). Now a put reserves its declared size when it begins: floor(100/60) = 1 is
// taken, the other seven are refused at once naming the budget and the reservations, and
// a small put still fits beside it.
TEST(ArtifactStore, PutsInFlightReserveTheirDeclaredSizeAgainstTheBudget) {
  auto s = Store::Open({.budget_bytes = 100 * kMiB, .max_artifact_bytes = 100 * kMiB, .dir = ""});
  ASSERT_TRUE(s.ok());
  std::vector<std::unique_ptr<PutSlot>> slow;
  int refused = 0;
  for (int i = 0; i < 8; ++i) {
    auto slot = (*s)->BeginPut(MakeKey("slow-" + std::to_string(i)), 60 * kMiB);
    if (!slot.ok()) {
      ++refused;
      EXPECT_EQ(slot.status().code(), absl::StatusCode::kResourceExhausted);
      EXPECT_THAT(std::string(slot.status().message()),
                  ::testing::AllOf(::testing::HasSubstr("--artifact_budget"),
                                   ::testing::HasSubstr("62914560 bytes reserved by 1 put")));
      continue;
    }
    ASSERT_TRUE((*slot)->Append("x").ok());
    slow.push_back(std::move(*slot));
    const Usage u = (*s)->usage();
    EXPECT_LE(u.resident_bytes + u.reserved_bytes, u.budget_bytes);
  }
  EXPECT_EQ(slow.size(), 1u) << "old code: all 8 begun";
  EXPECT_EQ(refused, 7);
  EXPECT_EQ((*s)->usage().reserved_bytes, 60 * kMiB);
  // Another put that fits beside the reservation is stored.
  ASSERT_NE(Put(**s, MakeKey("small"), std::string(kMiB, 's')), nullptr);
  Usage u = (*s)->usage();
  EXPECT_EQ(u.resident_bytes, kMiB);
  EXPECT_LE(u.resident_bytes + u.reserved_bytes, u.budget_bytes);
  // The abandoned put gives its reservation back.
  slow.clear();
  EXPECT_EQ((*s)->usage().reserved_bytes, 0u);
  EXPECT_EQ((*s)->usage().puts_in_flight, 0u);
}

TEST(ArtifactStore, AReservationDropsResidentArtifactsAndACommitKeepsItsRoom) {
  auto s = Store::Open({.budget_bytes = 100, .max_artifact_bytes = 100, .dir = ""});
  ASSERT_TRUE(s.ok());
  ASSERT_NE(Put(**s, MakeKey("old"), std::string(50, 'o')), nullptr);
  auto slot = (*s)->BeginPut(MakeKey("new"), 60);
  ASSERT_TRUE(slot.ok()) << slot.status();
  Usage u = (*s)->usage();
  EXPECT_EQ(u.resident_bytes, 0u) << "the least recently used made room for the reservation";
  EXPECT_EQ(u.reserved_bytes, 60u);
  // While it runs, nothing else may take its room: a 50-byte put is refused at once.
  EXPECT_EQ((*s)->BeginPut(MakeKey("other"), 50).status().code(),
            absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE((*slot)->Append(std::string(60, 'n')).ok());
  ASSERT_TRUE((*slot)->Commit({}).ok());
  u = (*s)->usage();
  EXPECT_EQ(u.resident_bytes, 60u);
  EXPECT_EQ(u.reserved_bytes, 0u);
}

// Issue 47, finding 8: a blob in --artifact_dir that was a symlink to a FIFO hung
// GetArtifact past its deadline (open waits for a writer). Each non-regular blob, and one of
// the wrong size, is now refused at once, naming the blob; on the old code the FIFO's Get
// never returns (the test then fails at its 5 s bound and unblocks it with a writer).
TEST(ArtifactStore, ABlobThatIsNotItsRegularFileIsRefusedAtOnce) {
  TempDir dir;
  const std::string elsewhere = dir.path() + "-fifo";
  ASSERT_EQ(::mkfifo(elsewhere.c_str(), 0600), 0);
  struct Case {
    const char* what;
    std::function<void(const std::string& blob)> plant;
  };
  const std::vector<Case> cases = {
      {"a symbolic link to a FIFO",
       [&](const std::string& b) { ASSERT_EQ(::symlink(elsewhere.c_str(), b.c_str()), 0); }},
      {"a FIFO", [](const std::string& b) { ASSERT_EQ(::mkfifo(b.c_str(), 0600), 0); }},
      {"a directory", [](const std::string& b) { ASSERT_EQ(::mkdir(b.c_str(), 0700), 0); }},
      {"a file of another size", [](const std::string& b) { std::ofstream(b) << "short"; }},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(cases[i].what);
    const Key k = MakeKey("case-" + std::to_string(i));
    std::string blob;
    {
      auto s = Store::Open({.dir = dir.path()});
      ASSERT_TRUE(s.ok());
      auto a = Put(**s, k, "sixteen bytes!!!");
      ASSERT_NE(a, nullptr);
      blob = dir.path() + "/" + a->id() + ".blob";
    }
    ASSERT_EQ(::unlink(blob.c_str()), 0);
    cases[i].plant(blob);
    auto s = Store::Open({.dir = dir.path()});
    ASSERT_TRUE(s.ok());
    const auto t0 = std::chrono::steady_clock::now();
    auto got = std::async(std::launch::async, [&] { return (*s)->Get(k); });
    if (got.wait_for(std::chrono::seconds(5)) != std::future_status::ready) {
      ADD_FAILURE() << "Get still blocked after 5 s";
      const int w = ::open(elsewhere.c_str(), O_WRONLY | O_NONBLOCK);  // lets the old code go
      const int w2 = ::open(blob.c_str(), O_WRONLY | O_NONBLOCK);
      if (w >= 0) ::close(w);
      if (w2 >= 0) ::close(w2);
    }
    auto r = got.get();
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
    EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss) << r.status();
    EXPECT_THAT(std::string(r.status().message()), ::testing::HasSubstr(blob));
    EXPECT_EQ((*s)->usage().on_disk, 0u) << "set aside, out of the index";
  }
  ::unlink(elsewhere.c_str());
}

TEST(ArtifactStore, TheDirectoryBudgetRemovesTheLeastRecentlyUsedBlob) {
  TempDir dir;
  auto s = Store::Open({.budget_bytes = 1 << 20,
                        .max_artifact_bytes = 1 << 20,
                        .dir = dir.path(),
                        .dir_budget_bytes = 25});
  ASSERT_TRUE(s.ok());
  auto a = Put(**s, MakeKey("a"), "aaaaaaaaaa");
  auto b = Put(**s, MakeKey("b"), "bbbbbbbbbb");
  ASSERT_TRUE(a && b);
  ASSERT_TRUE((*s)->Get(MakeKey("a")).ok());  // a is used after b: b is the oldest now
  auto c = Put(**s, MakeKey("c"), "cccccccccc");
  ASSERT_NE(c, nullptr);
  auto on_disk = [&](const std::shared_ptr<const Artifact>& x) {
    return std::filesystem::exists(dir.path() + "/" + x->id() + ".blob") &&
           std::filesystem::exists(dir.path() + "/" + x->id() + ".json");
  };
  EXPECT_TRUE(on_disk(a));
  EXPECT_FALSE(on_disk(b));
  EXPECT_TRUE(on_disk(c));
  const Usage u = (*s)->usage();
  EXPECT_EQ(u.disk_bytes, 20u);
  EXPECT_EQ(u.on_disk, 2u);
  EXPECT_EQ(u.dir_evictions, 1u);
  // Memory still serves the one that left the directory.
  EXPECT_TRUE((*s)->Get(MakeKey("b")).ok());
  // Reopened with a smaller budget, the least recently written goes at once (a before c).
  s->reset();
  auto small = Store::Open({.dir = dir.path(), .dir_budget_bytes = 10});
  ASSERT_TRUE(small.ok());
  EXPECT_EQ((*small)->usage().on_disk, 1u);
  EXPECT_FALSE(on_disk(a));
  EXPECT_TRUE(on_disk(c));
}

}  // namespace weightcache::artifact
