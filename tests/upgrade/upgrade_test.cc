// Upgrades keep the cache (issue 58, item 5): this tree's weightcached, beside a keeper that
// holds what the previous release (a710f38) deposited, adopts those entries and serves them
// without reading a byte of the checkpoint, and reads that release's digest store.
// The fixtures (a710f38/: the keeper record and the digest store) were written by a710f38's own
// weightcached and weightcache-keeper (make-fixtures.sh). The checkpoint they were loaded from is
// written here by the same deterministic writer (its SHA-256 must be the one the record names),
// and each segment's bytes are rebuilt from the record's manifest and that checkpoint (the
// record's segment digests, checked at adoption, vouch that they are the old daemon's bytes). A
// keeper record and a digest store entry name the file version the bytes came from (device, inode,
// mtime, ctime: what no checkout keeps), so the test moves them to its copy of the checkpoint first
// (Relocate: those fields only, the store signed again with its fixture key) — what staying on one
// node gives a real upgrade for free.
#include <fcntl.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "pkg/identity/identity.h"
#include "pkg/keeper/client.h"
#include "pkg/safetensors/writer.h"
#include "pkg/util/bytes.h"
#include "pkg/util/scoped_fd.h"
#include "tests/integration/daemon_harness.h"
#include "tests/integration/process.h"
#include "tests/testutil/temp_dir.h"
#include "weightcache/v1/keeper_record.pb.h"

namespace weightcache {
namespace {

using namespace std::chrono_literals;
using testing::Process;
using testing::TempDir;
namespace fs = std::filesystem;

const fs::path kFixtures = fs::path(FIXTURES_DIR) / "a710f38";

std::string ReadAll(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

const v1::EntryInfo* Entry(const v1::StatusResponse& st, const std::string& model) {
  for (const auto& e : st.entries()) {
    if (e.model() == model) return &e;
  }
  return nullptr;
}

// One record as the old keeper held it: its key, its bytes, its segments' bytes.
struct HeldRecord {
  std::string key;
  v1::KeeperRecord record;
  std::vector<std::string> segments;  // each zero-padded to its size (SealedSegment pads)
};

// The segments a tp-1, unquantized load leaves on the host backend: each tensor's bytes from
// the checkpoint file at the offset the record's manifest gives, zeros elsewhere.
std::vector<std::string> RebuildSegments(const v1::KeeperRecord& r, const std::string& file) {
  const std::string ckpt = ReadAll(file);
  uint64_t header_len = 0;
  std::memcpy(&header_len, ckpt.data(), sizeof header_len);  // little-endian, as the format says
  const nlohmann::json header = nlohmann::json::parse(ckpt.substr(8, header_len));
  std::vector<std::string> segs;
  for (int s = 0; s < r.segment_sizes_size(); ++s) segs.emplace_back(r.segment_used(s), '\0');
  for (const auto& t : r.tensors()) {
    const auto& at = header.at(t.name()).at("data_offsets");
    const uint64_t begin = at[0].get<uint64_t>(), end = at[1].get<uint64_t>();
    EXPECT_EQ(end - begin, t.nbytes()) << t.name();
    EXPECT_LE(t.offset() + t.nbytes(), segs[t.segment()].size()) << t.name();
    segs[t.segment()].replace(t.offset(), t.nbytes(), ckpt, 8 + header_len + begin, t.nbytes());
  }
  return segs;
}

std::vector<HeldRecord> ReadRecords(const std::string& checkpoint_file) {
  std::vector<HeldRecord> out;
  for (int i = 0; fs::exists(kFixtures / "records" / absl::StrCat(i, ".key")); ++i) {
    const fs::path stem = kFixtures / "records" / absl::StrCat(i);
    HeldRecord h;
    h.key = ReadAll(stem.string() + ".key");
    EXPECT_TRUE(h.record.ParseFromString(ReadAll(stem.string() + ".record"))) << stem;
    h.segments = RebuildSegments(h.record, checkpoint_file);
    out.push_back(std::move(h));
  }
  return out;
}

// A sealed memfd holding `bytes` zero-padded to `size`, as the host backend leaves a segment;
// its read-only descriptor (what the old daemon deposited).
ScopedFd SealedSegment(const std::string& bytes, uint64_t size) {
  ScopedFd fd(::memfd_create("fixture", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  EXPECT_TRUE(fd.valid());
  EXPECT_EQ(::ftruncate(fd.get(), static_cast<off_t>(size)), 0);
  EXPECT_EQ(::pwrite(fd.get(), bytes.data(), bytes.size(), 0), static_cast<ssize_t>(bytes.size()));
  EXPECT_EQ(
      ::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL), 0);
  return ScopedFd(::open(absl::StrCat("/proc/self/fd/", fd.get()).c_str(), O_RDONLY | O_CLOEXEC));
}

std::string HmacHex(const std::string& key, const std::string& text) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
       reinterpret_cast<const unsigned char*>(text.data()), text.size(), md, &len);
  return HexEncode(md, len);
}

class PreviousFormatTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fs::exists(kFixtures / "COMMIT")) << kFixtures;
    ASSERT_TRUE(safetensors::WriteLlamaCheckpoint(dir_ / "m", safetensors::TinyLlama()).ok());
    fs::create_directories(dir_ / "state");
    fs::permissions(dir_ / "state", fs::perms::owner_all);
    for (const std::string f : {"digests.json", "digests.json.key"}) {
      fs::copy_file(kFixtures / "state" / f, dir_ / ("state/" + f));
      fs::permissions(dir_ / ("state/" + f), fs::perms::owner_read | fs::perms::owner_write);
    }
    records_ = ReadRecords(dir_ / "m/model.safetensors");
    ASSERT_EQ(records_.size(), 1u) << "the fixture holds one entry (model m)";
    // The writer still writes the bytes a710f38 loaded: the file the record names.
    ASSERT_EQ(records_[0].record.files_size(), 1);
    ASSERT_EQ("sha256:" + identity::Sha256Hex(ReadAll(dir_ / "m/model.safetensors")),
              records_[0].record.files(0).digest())
        << "the checkpoint writer changed: regenerate the fixtures (make-fixtures.sh)";
    model_bytes_ = fs::file_size(dir_ / "m/model.safetensors");
    Relocate();
  }

  // The fixture's file versions become this checkout's: in every record, the model dir and
  // each file's path and stat; in the digest store, the key of each entry that named a
  // recorded file version, the store then signed again with its (fixture) key.
  void Relocate() {
    std::map<std::tuple<uint64_t, uint64_t, int64_t, int64_t>, identity::FileStat> moved;
    for (auto& h : records_) {
      h.record.set_model_dir(dir_ / "m");
      for (auto& f : *h.record.mutable_files()) {
        const std::string path = dir_ / ("m/" + f.name());
        auto now = identity::StatPath(path);
        ASSERT_TRUE(now.ok()) << now.status();
        moved[{f.dev(), f.ino(), f.mtime_ns(), f.ctime_ns()}] = *now;
        f.set_path(path);
        f.set_dev(now->dev);
        f.set_ino(now->ino);
        f.set_mtime_ns(now->mtime_ns);
        f.set_ctime_ns(now->ctime_ns);
      }
    }
    const fs::path store = dir_ / "state/digests.json";
    auto j = nlohmann::json::parse(ReadAll(store));
    int relocated = 0;
    for (auto& e : j.at("entries")) {
      auto it = moved.find({e.at("dev").get<uint64_t>(), e.at("ino").get<uint64_t>(),
                            e.at("mtime_ns").get<int64_t>(), e.at("ctime_ns").get<int64_t>()});
      if (it == moved.end()) continue;
      e["dev"] = it->second.dev;
      e["ino"] = it->second.ino;
      e["mtime_ns"] = it->second.mtime_ns;
      e["ctime_ns"] = it->second.ctime_ns;
      ++relocated;
    }
    ASSERT_EQ(relocated, 1) << "the old daemon's store names the checkpoint's one file";
    j["hmac"] = HmacHex(ReadAll(dir_ / "state/digests.json.key"), j.at("entries").dump());
    std::ofstream(store) << j.dump(1) << "\n";
  }

  std::string keeper_sock() const { return dir_ / "k/keeper.sock"; }
  std::string socket_dir() const { return dir_ / "s"; }

  std::unique_ptr<Process> StartKeeper() {
    return testing::StartKeeper(KEEPER_PATH, keeper_sock(), dir_ / "keeper.log");
  }

  // What the old daemon left in its keeper: each record with its segments' descriptors.
  void DepositOldRecords() {
    auto c = keeper::KeeperClient::Connect(keeper_sock());
    ASSERT_TRUE(c.ok()) << c.status();
    for (const auto& h : records_) {
      std::vector<ScopedFd> owned;
      std::vector<int> fds;
      for (int s = 0; s < h.record.segment_sizes_size(); ++s) {
        owned.push_back(SealedSegment(h.segments[s], h.record.segment_sizes(s)));
        fds.push_back(owned.back().get());
      }
      ASSERT_TRUE((*c)->Deposit(h.key, h.record.SerializeAsString(), fds).ok());
    }
  }

  std::unique_ptr<Process> StartDaemon() {
    auto d = testing::StartDaemon(
        {WEIGHTCACHED_PATH, "--socket_dir=" + socket_dir(), "--backend=host",
         "--metrics_address=off", "--keeper_socket=" + keeper_sock(),
         "--digest_store=" + dir_ / "state/digests.json", "--model=name=m,model_dir=" + dir_ / "m"},
        socket_dir(), dir_ / "daemon.log", [](const v1::StatusResponse& st) {
          const auto* e = Entry(st, "m");
          return e != nullptr && e->state() == "ready" && st.keeper().up() &&
                 st.keeper().pending_entries() == 0;
        });
    EXPECT_TRUE(d.ok()) << d.status();
    if (!d.ok()) return nullptr;
    client_ = std::move(d->client);
    return std::move(d->process);
  }

  TempDir dir_;
  std::vector<HeldRecord> records_;
  uint64_t model_bytes_ = 0;
  std::unique_ptr<client::Client> client_;
};

TEST_F(PreviousFormatTest, PreviousFormatKeeperRecordsAreAdoptedWithNoCheckpointByteRead) {
  auto keeper = StartKeeper();
  DepositOldRecords();
  auto daemon = StartDaemon();
  ASSERT_TRUE(daemon) << testing::ReadFileOrEmpty(dir_ / "daemon.log");
  auto st = client_->Status();
  ASSERT_TRUE(st.ok()) << st.status();
  const auto* e = Entry(*st, "m");
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->source(), "keeper") << testing::ReadFileOrEmpty(dir_ / "daemon.log");
  EXPECT_EQ(e->fingerprint(), records_[0].record.fingerprint());
  EXPECT_EQ(st->keeper().adopted_entries(), 1u);
  EXPECT_EQ(st->keeper().dropped_entries(), 0u) << st->keeper().last_error();
  // Not a byte of the checkpoint: no load (bytes_read) and no hashing (the old store's digest).
  EXPECT_EQ(e->bytes_read(), 0u);
  EXPECT_EQ(st->hashed_bytes(), 0u);
  const uint64_t rchar = testing::ProcIo(daemon->pid(), "rchar");
  std::printf("a710f38's records adopted: rchar %llu bytes (checkpoint %llu bytes)\n",
              static_cast<unsigned long long>(rchar),
              static_cast<unsigned long long>(model_bytes_));

  // An engine maps the adopted bytes: every byte equal to the checkpoint's.
  Process engine({TEST_CLIENT_PATH, socket_dir() + "/control.sock", "m"}, dir_ / "client.log");
  EXPECT_EQ(engine.WaitFor("BYTES", 20s).value_or("none"), "BYTES OK");
  engine.CloseStdin();
  EXPECT_EQ(engine.Wait(), 0);
}

}  // namespace
}  // namespace weightcache
