// Pinned digests (issue 48): the spec names each checkpoint file's SHA-256. Opening then
// reads no file for its digest and names the weights as a node that hashed them does; a load
// from disk checks the bytes and refuses a file that hashes otherwise; pins that do not cover
// the checkpoint exactly are refused naming the model and the files.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "pkg/identity/identity.h"
#include "pkg/load/loader.h"
#include "pkg/load/model.h"
#include "pkg/load/plan.h"
#include "pkg/memory/backend.h"
#include "pkg/safetensors/writer.h"
#include "pkg/util/status_macros.h"
#include "tests/testutil/temp_dir.h"

namespace weightcache::load {
namespace {

using ::testing::HasSubstr;
using testing::TempDir;

spec::ModelSpec SpecFor(const std::string& dir) {
  spec::ModelSpec s;
  s.name = "tiny";
  s.model_dir = dir;
  return s;
}

std::string FileBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Every *.safetensors file of `dir` by name, with the SHA-256 of its bytes (what sha256sum
// prints, computed here apart from the daemon's code path).
std::map<std::string, std::string> Sha256Of(const std::string& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.path().extension() != ".safetensors") continue;
    out[e.path().filename().string()] = identity::Sha256Hex(FileBytes(e.path().string()));
  }
  return out;
}

std::unique_ptr<identity::DigestStore> MemoryStore() {
  auto s = identity::DigestStore::Open("");
  EXPECT_TRUE(s.ok());
  return std::move(s).value();
}

// Writes a two-file checkpoint into `dir`; `*s` is its spec with every file pinned right.
void WritePinnedTwoFileCheckpoint(const std::string& dir, spec::ModelSpec* s) {
  ASSERT_TRUE(safetensors::WriteLlamaCheckpoint(dir, {.shards = 2}).ok());
  *s = SpecFor(dir);
  s->digests = Sha256Of(dir);
}

uint64_t DirBytes(const std::string& dir) {
  uint64_t n = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.path().extension() == ".safetensors") n += std::filesystem::file_size(e.path());
  }
  return n;
}

TEST(PinnedDigests, TheFingerprintNeedsNoReadAndEqualsAHashingNodes) {
  TempDir dir;
  ASSERT_TRUE(safetensors::WriteLlamaCheckpoint(dir.path(), {.shards = 3}).ok());
  // A node that hashed the files.
  auto hashing_store = MemoryStore();
  auto hashed = OpenModel(SpecFor(dir.path()), {.digests = hashing_store.get()});
  ASSERT_TRUE(hashed.ok()) << hashed.status();
  EXPECT_EQ(hashing_store->hashed_bytes(), DirBytes(dir.path()));
  // A node told the digests.
  spec::ModelSpec pinned = SpecFor(dir.path());
  pinned.digests = Sha256Of(dir.path());
  ASSERT_EQ(pinned.digests.size(), 3u);
  auto cold_store = MemoryStore();
  auto told = OpenModel(pinned, {.digests = cold_store.get()});
  ASSERT_TRUE(told.ok()) << told.status();
  EXPECT_EQ(cold_store->hashed_bytes(), 0u);  // not a checkpoint byte read for identity
  for (const auto& f : (*told)->files) {
    EXPECT_EQ(f.digest_source, identity::DigestSource::kPinned) << f.name;
  }
  const spec::Environment env;
  for (int rank = 0; rank < 2; ++rank) {
    const spec::Layout layout{.tp_size = 2, .tp_rank = rank};
    EXPECT_EQ((*told)->Inputs(layout, env).Digest(), (*hashed)->Inputs(layout, env).Digest());
  }
  // And a node that hashed before knows a pin agrees without reading: source "digest store".
  pinned.digests = Sha256Of(dir.path());
  auto known = OpenModel(pinned, {.digests = hashing_store.get()});
  ASSERT_TRUE(known.ok()) << known.status();
  EXPECT_EQ(known.value()->files[0].digest_source, identity::DigestSource::kStore);
}

TEST(PinnedDigests, ALoadChecksTheBytesAndRefusesAFileThatHashesOtherwise) {
  TempDir dir;
  spec::ModelSpec s;
  ASSERT_NO_FATAL_FAILURE(WritePinnedTwoFileCheckpoint(dir.path(), &s));
  const std::string victim = "model-00002-of-00002.safetensors";
  const std::string right = s.digests.at(victim);
  std::string wrong = right;
  wrong[0] = wrong[0] == 'a' ? 'b' : 'a';
  s.digests[victim] = wrong;
  auto store = MemoryStore();
  auto m = OpenModel(s, {.digests = store.get()});
  ASSERT_TRUE(m.ok()) << m.status();  // opening takes the pins on trust...
  EXPECT_EQ(store->hashed_bytes(), 0u);
  auto backend = memory::MakeHostBackend();
  auto plan = PlanRank(**m, {}, {});
  ASSERT_TRUE(plan.ok()) << plan.status();
  LoadProgress progress;
  auto loaded = LoadRank(**m, *plan, *backend, "", "tiny", {}, &progress);
  ASSERT_FALSE(loaded.ok());  // ...the load does not
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kDataLoss) << loaded.status();
  EXPECT_TRUE(IsPinnedDigestMismatch(loaded.status()));
  EXPECT_EQ(std::string(loaded.status().message()),
            "model 'tiny': pinned digest mismatch: " + victim + " hashes to sha256:" + right +
                " but the spec pins sha256:" + wrong +
                "; refused: the file is not the checkpoint the spec names");
  // The victim was hashed once to check it (from the load's own reads: OnePass...); the
  // other file too, as it was read before the victim.
  const uint64_t hashed = store->hashed_bytes();
  EXPECT_GE(hashed, std::filesystem::file_size(dir.path() + "/" + victim));
  EXPECT_LE(hashed, DirBytes(dir.path()));
  // The store remembers what this version hashes to: the next open refuses at once.
  auto again = OpenModel(s, {.digests = store.get()});
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(IsPinnedDigestMismatch(again.status()));
  EXPECT_THAT(std::string(again.status().message()),
              HasSubstr(victim + " hashes to sha256:" + right +
                        " (this node read it) but the "
                        "spec pins sha256:" +
                        wrong));
  EXPECT_EQ(store->hashed_bytes(), hashed);

  // The right pins load, with the bytes of the files (a new load, a new progress: the
  // mismatch cancelled the first one's, as it does an entry's).
  s.digests[victim] = right;
  auto good = OpenModel(s, {.digests = store.get()});
  ASSERT_TRUE(good.ok()) << good.status();
  auto group = PlanRank(**good, {}, {});
  ASSERT_TRUE(group.ok());
  LoadProgress second;
  auto fine = LoadRanks(**good, {*group}, *backend, {""}, {"tiny"}, {}, &second);
  ASSERT_TRUE(fine.ok()) << fine.status();
  for (const auto& t : (*fine)[0]->plan.tensors) {
    const auto& file = (*good)->checkpoint.files()[t.file_index].info();
    std::string got(t.nbytes, '\0');
    ASSERT_EQ(::pread((*fine)[0]->segments[t.segment]->fd(), got.data(), t.nbytes,
                      static_cast<off_t>(t.offset)),
              static_cast<ssize_t>(t.nbytes));
    ASSERT_EQ(got, FileBytes(file.path).substr(t.file_offset, t.nbytes)) << t.name;
  }
}

TEST(PinnedDigests, ATensorParallelGroupLoadChecksThePinsToo) {
  TempDir dir;
  ASSERT_TRUE(safetensors::WriteLlamaCheckpoint(dir.path(), {}).ok());
  spec::ModelSpec s = SpecFor(dir.path());
  s.tp_size = 2;
  s.digests = {{"model.safetensors", std::string(64, 'e')}};
  auto m = OpenModel(s);
  ASSERT_TRUE(m.ok()) << m.status();
  std::vector<Plan> plans;
  for (int r = 0; r < 2; ++r) {
    auto p = PlanRank(**m, {2, r, 1, 0}, {256, 1ull << 30, true});
    ASSERT_TRUE(p.ok()) << p.status();
    plans.push_back(*p);
  }
  auto backend = memory::MakeHostBackend();
  auto loaded = LoadRanks(**m, plans, *backend, {"", ""}, {"r0", "r1"}, {}, nullptr);
  ASSERT_FALSE(loaded.ok());
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(loaded.status().message()),
              HasSubstr("model.safetensors hashes to sha256:" +
                        identity::Sha256Hex(FileBytes(dir.path() + "/model.safetensors"))));
}

// A mismatch stops the load when it is found, not when the load has read every byte: the
// first file hashes otherwise than pinned, and its last chunk (the check follows the load's
// reads) stops the load before the second file is read.
TEST(PinnedDigests, AMismatchStopsTheLoadWhenItIsFound) {
  TempDir dir;
  spec::ModelSpec s;
  ASSERT_NO_FATAL_FAILURE(WritePinnedTwoFileCheckpoint(dir.path(), &s));
  const std::string victim = "model-00001-of-00002.safetensors";
  s.digests[victim] = std::string(64, 'e');
  auto store = MemoryStore();
  auto m = OpenModel(s, {.digests = store.get()});
  ASSERT_TRUE(m.ok()) << m.status();
  auto plan = PlanRank(**m, {}, {});
  ASSERT_TRUE(plan.ok());
  auto backend = memory::MakeHostBackend();
  LoadProgress progress;
  auto loaded = LoadRank(**m, *plan, *backend, "", "tiny", {.read_threads = 2}, &progress);
  EXPECT_TRUE(progress.cancelled()) << "the load was not told to stop when the mismatch was found";
  ASSERT_FALSE(loaded.ok());
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kDataLoss) << loaded.status();
  EXPECT_THAT(std::string(loaded.status().message()), HasSubstr(victim + " hashes to"));
  // How far the reads got is not asserted: they run ahead of the hash (a reader only copies,
  // hashers follow, at most the hold's bytes behind), so on a checkpoint this small the load
  // may have read every byte before the first file's hash ended; what matters is that it was
  // told to stop and that nothing of it is served.
}

// The bytes a check hashes are the file's as the load read them only while the file is not
// written: a chunk the check reads again (left for want of room), the header, the parts a
// lone rank does not load come from a second read. A writer of the model directory who
// changes a pinned file after it was opened (here: one byte, in place, same inode and size)
// gets the load refused as UNAVAILABLE naming the file, whatever the bytes hash to, and not
// the CANCELLED the check's stop would otherwise leave.
TEST(PinnedDigests, AFileWrittenAfterItWasOpenedIsRefusedNamingIt) {
  TempDir dir;
  spec::ModelSpec s;
  ASSERT_NO_FATAL_FAILURE(WritePinnedTwoFileCheckpoint(dir.path(), &s));
  const std::string victim = "model-00001-of-00002.safetensors";
  auto store = MemoryStore();
  auto m = OpenModel(s, {.digests = store.get()});
  ASSERT_TRUE(m.ok()) << m.status();
  {
    const int fd = ::open((dir.path() + "/" + victim).c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    const off_t at = static_cast<off_t>(std::filesystem::file_size(dir.path() + "/" + victim) / 2);
    char c = 0;
    ASSERT_EQ(::pread(fd, &c, 1, at), 1);
    c = static_cast<char>(c ^ 0x5a);
    ASSERT_EQ(::pwrite(fd, &c, 1, at), 1);
    ::close(fd);
  }
  auto plan = PlanRank(**m, {}, {});
  ASSERT_TRUE(plan.ok());
  auto backend = memory::MakeHostBackend();
  LoadProgress progress;
  auto loaded = LoadRank(**m, *plan, *backend, "", "tiny", {.read_threads = 2}, &progress);
  ASSERT_FALSE(loaded.ok());
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kUnavailable) << loaded.status();
  EXPECT_THAT(std::string(loaded.status().message()), HasSubstr(victim));
  EXPECT_THAT(std::string(loaded.status().message()), HasSubstr("since it was opened"));
}

// A cancelled load (the daemon stopping) stops the check of the pins too, and says CANCELLED.
TEST(PinnedDigests, ACancelledLoadStopsTheCheckToo) {
  TempDir dir;
  spec::ModelSpec s;
  ASSERT_NO_FATAL_FAILURE(WritePinnedTwoFileCheckpoint(dir.path(), &s));
  auto store = MemoryStore();
  auto m = OpenModel(s, {.digests = store.get()});
  ASSERT_TRUE(m.ok()) << m.status();
  auto backend = memory::MakeHostBackend();
  auto plan = PlanRank(**m, {}, {});
  ASSERT_TRUE(plan.ok());
  LoadProgress progress;
  progress.Cancel();
  auto loaded = LoadRank(**m, *plan, *backend, "", "tiny", {}, &progress);
  ASSERT_FALSE(loaded.ok());
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kCancelled) << loaded.status();
}

// Bytes this process has read through read(2)/pread(2) so far (/proc/self/io rchar): what
// a pinned load costs in reads, whichever code path reads.
uint64_t ReadSyscallBytes() {
  std::ifstream io("/proc/self/io");
  std::string key;
  uint64_t value = 0;
  while (io >> key >> value) {
    if (key == "rchar:") return value;
  }
  ADD_FAILURE() << "no rchar in /proc/self/io";
  return 0;
}

// A load's stats and the bytes this process read while it ran.
struct CountedLoad {
  LoadStats stats;
  uint64_t read = 0;
};
CountedLoad CountingReads(const std::function<absl::StatusOr<LoadStats>()>& load) {
  const uint64_t before = ReadSyscallBytes();
  absl::StatusOr<LoadStats> st = load();
  CountedLoad out;
  out.read = ReadSyscallBytes() - before;
  EXPECT_TRUE(st.ok()) << st.status();
  if (st.ok()) out.stats = *st;
  return out;
}

uint64_t HeaderBytes(const OpenedModel& m) {
  uint64_t n = 0;
  for (const auto& f : m.checkpoint.files()) n += f.info().data_offset;
  return n;
}

// Issue 58, item 1: a load of a pinned checkpoint reads each byte once. The check's SHA-256
// follows the load's reads: the bytes hashed from them plus the few the check read itself
// (each file's header, parsed at open) are the checkpoint, and the process read about the
// checkpoint's size in all (the old check hashed every file again: twice the size).
TEST(PinnedDigests, OnePassAPinnedLoadReadsEachCheckpointByteOnce) {
  TempDir dir;
  spec::ModelSpec s;
  ASSERT_NO_FATAL_FAILURE(WritePinnedTwoFileCheckpoint(dir.path(), &s));
  const uint64_t size = DirBytes(dir.path());
  auto store = MemoryStore();
  auto m = OpenModel(s, {.digests = store.get()});
  ASSERT_TRUE(m.ok()) << m.status();
  auto plan = PlanRank(**m, {}, {});
  ASSERT_TRUE(plan.ok());
  auto backend = memory::MakeHostBackend();
  const auto [st, read] = CountingReads([&]() -> absl::StatusOr<LoadStats> {
    WC_ASSIGN_OR_RETURN(auto loaded, LoadRank(**m, *plan, *backend, "", "tiny", {}, nullptr));
    return loaded->stats;
  });
  EXPECT_EQ(st.pin_followed_bytes + st.pin_reread_bytes, size);
  EXPECT_EQ(st.pin_reread_bytes, HeaderBytes(**m)) << "the check read more than the headers";
  EXPECT_GT(st.pin_finish_seconds, 0) << "the check's verdict came after the reads: timed";
  EXPECT_GT(st.pin_hash_seconds, 0) << "the load's bytes were hashed: the hashers' time counted";
  EXPECT_EQ(store->hashed_bytes(), size) << "each byte hashed once";
  EXPECT_GE(read, size);
  EXPECT_LT(read, size + size / 8)
      << "read " << read << " bytes for a " << size << "-byte checkpoint: more than one pass";
  // The store learned the files from the load: the next open and load read none for a check.
  auto again = OpenModel(s, {.digests = store.get()});
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ((*again)->files[0].digest_source, identity::DigestSource::kStore);
  auto plan2 = PlanRank(**again, {}, {});
  ASSERT_TRUE(plan2.ok());
  auto second = LoadRank(**again, *plan2, *backend, "", "tiny", {}, nullptr);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ((*second)->stats.pin_followed_bytes + (*second)->stats.pin_reread_bytes, 0u);
}

// The same for a tensor-parallel group (one pass for every rank, scatter.h) and for one rank
// of two alone: what its plan does not read, the check reads itself, once.
TEST(PinnedDigests, OnePassATensorParallelGroupAndALoneRankReadEachByteOnce) {
  TempDir dir;
  spec::ModelSpec s;
  ASSERT_NO_FATAL_FAILURE(WritePinnedTwoFileCheckpoint(dir.path(), &s));
  s.tp_size = 2;
  const uint64_t size = DirBytes(dir.path());
  auto backend = memory::MakeHostBackend();
  {
    auto store = MemoryStore();
    auto m = OpenModel(s, {.digests = store.get()});
    ASSERT_TRUE(m.ok()) << m.status();
    std::vector<Plan> plans;
    for (int r = 0; r < 2; ++r) {
      auto p = PlanRank(**m, {2, r, 1, 0}, {256, 1ull << 30, true});
      ASSERT_TRUE(p.ok()) << p.status();
      plans.push_back(*std::move(p));
    }
    const auto [st, read] = CountingReads([&]() -> absl::StatusOr<LoadStats> {
      WC_ASSIGN_OR_RETURN(auto loaded,
                          LoadRanks(**m, plans, *backend, {"", ""}, {"r0", "r1"}, {}, nullptr));
      return loaded[0]->stats;
    });
    EXPECT_EQ(st.pin_followed_bytes + st.pin_reread_bytes, size);
    EXPECT_LT(read, size + size / 8) << "read " << read << " of " << size;
  }
  {
    auto store = MemoryStore();
    auto m = OpenModel(s, {.digests = store.get()});
    ASSERT_TRUE(m.ok()) << m.status();
    auto p = PlanRank(**m, {2, 1, 1, 0}, {256, 1ull << 30, true});
    ASSERT_TRUE(p.ok()) << p.status();
    const auto [st, read] = CountingReads([&]() -> absl::StatusOr<LoadStats> {
      WC_ASSIGN_OR_RETURN(auto loaded, LoadRank(**m, *p, *backend, "", "r1", {}, nullptr));
      return loaded->stats;
    });
    EXPECT_EQ(st.pin_followed_bytes + st.pin_reread_bytes, size);
    EXPECT_GT(st.pin_reread_bytes, HeaderBytes(**m)) << "a lone rank reads only its shards";
    EXPECT_LT(read, size + size / 8) << "read " << read << " of " << size;
  }
}

// Noticed in issue 58's review: a lone rank on the host backend read its files one after
// another, so a pinned load's hashers (one per file) took the files one at a time. Where the
// load's reads are followed (a read tap: what a pinned load sets), the files now take turns
// chunk by chunk; files_side_by_side = 1 keeps them one after another; the bytes are the same.
TEST(PinnedDigests, ParallelDigestALoneHostRankReadsItsFilesSideBySide) {
  TempDir dir;
  spec::ModelSpec s;
  ASSERT_NO_FATAL_FAILURE(WritePinnedTwoFileCheckpoint(dir.path(), &s));
  auto store = MemoryStore();
  auto m = OpenModel(SpecFor(dir.path()), {.digests = store.get()});
  ASSERT_TRUE(m.ok()) << m.status();
  auto plan = PlanRank(**m, {}, {});
  ASSERT_TRUE(plan.ok()) << plan.status();
  auto backend = memory::MakeHostBackend();
  const auto& files = (*m)->checkpoint.files();
  ASSERT_EQ(files.size(), 2u);
  // The file of each chunk, in the order the load read them (one reader: a strict order).
  auto load = [&](size_t side_by_side, std::vector<int>* order) -> std::vector<std::string> {
    std::mutex mu;
    const safetensors::ReadTap tap = [&](int fd, uint64_t, const void*, uint64_t) {
      std::lock_guard<std::mutex> l(mu);
      order->push_back(fd == files[0].fd() ? 0 : fd == files[1].fd() ? 1 : -1);
    };
    LoadOptions o;
    o.read_tap = &tap;
    o.read_threads = 1;
    o.chunk_bytes = 4096;
    o.files_side_by_side = side_by_side;
    auto loaded = LoadRank(**m, *plan, *backend, "", "tiny", o, nullptr);
    EXPECT_TRUE(loaded.ok()) << loaded.status();
    std::vector<std::string> bytes;
    for (auto& seg : (*loaded)->segments) {  // sealed: read through its memfd
      std::string b(seg->size(), '\0');
      EXPECT_EQ(::pread(seg->fd(), b.data(), b.size(), 0), static_cast<ssize_t>(b.size()));
      bytes.push_back(std::move(b));
    }
    return bytes;
  };
  std::vector<int> turns, in_order;
  const auto side_by_side = load(0, &turns);  // a tap set: the pinned default
  const auto one_by_one = load(1, &in_order);
  ASSERT_GT(std::count(turns.begin(), turns.end(), 1), 2) << "file 2 is read in several chunks";
  EXPECT_EQ(std::count(turns.begin(), turns.end(), -1), 0);
  const auto first_of_2 = std::find(turns.begin(), turns.end(), 1) - turns.begin();
  const auto last_of_1 = turns.rend() - std::find(turns.rbegin(), turns.rend(), 0) - 1;
  EXPECT_LT(first_of_2, last_of_1) << "file 2's reads began only after file 1's ended";
  EXPECT_TRUE(std::is_sorted(in_order.begin(), in_order.end())) << "files_side_by_side = 1";
  EXPECT_EQ(side_by_side, one_by_one) << "the same bytes either way";
}

TEST(PinnedDigests, PinsMustNameExactlyTheCheckpointsFiles) {
  TempDir dir;
  ASSERT_TRUE(safetensors::WriteLlamaCheckpoint(dir.path(), {.shards = 2}).ok());
  const auto digests = Sha256Of(dir.path());
  const std::string files =
      " (the checkpoint's files: model-00001-of-00002.safetensors, "
      "model-00002-of-00002.safetensors; `weightcachectl pin tiny` prints the block on a node "
      "that hashed them)";
  // A file left out while another is pinned.
  spec::ModelSpec partial = SpecFor(dir.path());
  partial.digests = {*digests.begin()};
  auto m = OpenModel(partial);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(m.status().message()),
            "model 'tiny': digests: checkpoint file \"model-00002-of-00002.safetensors\" has no "
            "pinned digest (when any file is pinned, every one must be)" +
                files);
  // A pin for a file the checkpoint does not have.
  spec::ModelSpec extra = SpecFor(dir.path());
  extra.digests = digests;
  extra.digests["model-00003-of-00002.safetensors"] = std::string(64, 'c');
  m = OpenModel(extra);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(m.status().message()),
            "model 'tiny': digests: a digest is pinned for \"model-00003-of-00002.safetensors\", "
            "which is not a checkpoint file of " +
                dir.path() + files);
}

}  // namespace
}  // namespace weightcache::load
