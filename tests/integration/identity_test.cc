// Weights identity, end to end on the host backend (issue 11): content decides the
// fingerprint, changed files are stale and never a hit, verify compares with the asked spec's
// files, every rank loads, names that share an entry, draining entries, and the CLI.
#include "pkg/identity/identity.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "pkg/client/client.h"
#include "pkg/safetensors/safetensors.h"
#include "pkg/safetensors/writer.h"
#include "tests/integration/daemon_harness.h"
#include "tests/integration/process.h"
#include "tests/testutil/temp_dir.h"
#include "weightcache/v1/weightcache.pb.h"

namespace weightcache {
namespace {

using namespace std::chrono_literals;
using ::testing::HasSubstr;
using testing::Process;
using ::testing::StartsWith;
using testing::TempDir;

// The checkpoint's bytes of tensor `name`.
std::string DiskBytes(const std::string& dir, const std::string& name) {
  auto ckpt = safetensors::Checkpoint::Open(dir);
  if (!ckpt.ok()) return "";
  const auto* t = ckpt->Find(name);
  if (t == nullptr) return "";
  std::string out(t->nbytes, '\0');
  if (::pread(ckpt->files()[t->file_index].fd(), out.data(), t->nbytes,
              static_cast<off_t>(t->file_offset)) != static_cast<ssize_t>(t->nbytes)) {
    return "";
  }
  return out;
}

std::string Mapped(const client::Lease& l, const std::string& name) {
  const auto* v = l.Find(name);
  return v == nullptr ? "" : std::string(static_cast<const char*>(v->data), v->nbytes);
}

constexpr const char* kTensor = "model.layers.0.self_attn.q_proj.weight";

class IdentityTest : public ::testing::Test {
 protected:
  void Write(const std::string& name, uint64_t seed) {
    auto shape = testing::SmallLlama();
    shape.seed = seed;
    ASSERT_TRUE(safetensors::WriteLlamaCheckpoint(dir_ / name, shape).ok());
  }

  void Start(const std::string& specs_yaml, std::vector<std::string> extra = {}) {
    std::ofstream(dir_ / "specs.yaml", std::ios::trunc) << specs_yaml;
    std::vector<std::string> argv{WEIGHTCACHED_PATH, "--socket_dir=" + socket_dir(),
                                  "--backend=host", "--metrics_address=off",
                                  "--spec_file=" + dir_ / "specs.yaml"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    auto d = testing::StartDaemon(argv, socket_dir(), dir_ / "daemon.log");
    ASSERT_TRUE(d.ok()) << d.status();
    daemon_ = std::move(d->process);
    client_ = std::move(d->client);
  }

  void Stop() {
    client_.reset();
    daemon_->Kill(SIGTERM);
    daemon_->Wait();
    daemon_.reset();
  }

  std::string Spec(const std::string& name, const std::string& subdir, int tp = 1) {
    return "  - name: " + name + "\n    model_dir: " + dir_ / subdir +
           "\n    tp_size: " + std::to_string(tp) + "\n";
  }

  absl::StatusOr<std::unique_ptr<client::Lease>> Acquire(const std::string& model,
                                                         bool load = false, int tp_size = 1,
                                                         int tp_rank = 0) {
    client::AcquireOptions o;
    o.model = model;
    o.wait_ready = true;
    o.load_on_miss = load;
    o.tp_size = tp_size;
    o.tp_rank = tp_rank;
    return client_->Acquire(o);
  }

  testing::ToolRun Ctl(std::vector<std::string> args) {
    args.insert(args.begin(), {WEIGHTCACHECTL_PATH, "--socket=" + socket_dir()});
    return testing::RunTool(args, dir_ / "ctl.err");
  }

  // weightcachectl on the admin socket (the operator's, which `pin` needs).
  testing::ToolRun AdminCtl(std::vector<std::string> args) {
    args.insert(args.begin(), {WEIGHTCACHECTL_PATH, "--socket=" + socket_dir() + "-admin"});
    return testing::RunTool(args, dir_ / "ctl.err");
  }

  // The SHA-256 of a file, as sha256sum prints it (apart from the daemon's code path).
  static std::string Sha256Of(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return identity::Sha256Hex(ss.str());
  }

  v1::StatusResponse WaitStatus(const std::function<bool(const v1::StatusResponse&)>& pred) {
    return testing::WaitForStatus(*client_, pred, 5s);
  }

  std::string socket_dir() const { return dir_ / "s"; }

  TempDir dir_;
  std::unique_ptr<Process> daemon_;
  std::unique_ptr<client::Client> client_;
};

TEST_F(IdentityTest, IdenticalHeadersDifferentWeightsAreTwoEntriesEachWithItsOwnBytes) {
  Write("a", 42);
  Write("b", 43);  // a "fine-tune": same names, shapes and header bytes, other weights
  Start("models:\n" + Spec("base", "a") + Spec("finetune", "b"));
  auto base = Acquire("base");
  auto ft = Acquire("finetune");
  ASSERT_TRUE(base.ok()) << base.status();
  ASSERT_TRUE(ft.ok()) << ft.status();
  EXPECT_NE((*base)->fingerprint(), (*ft)->fingerprint());
  EXPECT_EQ((*ft)->model(), "finetune");
  EXPECT_EQ(Mapped(**base, kTensor), DiskBytes(dir_ / "a", kTensor));
  EXPECT_EQ(Mapped(**ft, kTensor), DiskBytes(dir_ / "b", kTensor));
  ASSERT_NE(DiskBytes(dir_ / "a", kTensor), DiskBytes(dir_ / "b", kTensor));

  // verify compares with the named spec's files, and fails against the other model's.
  testing::ToolRun ok = Ctl({"verify", "finetune"});
  EXPECT_EQ(ok.rc, 0) << ok.out;
  EXPECT_THAT(ok.out, HasSubstr("mapped finetune:"));
  EXPECT_THAT(ok.out, HasSubstr("verify OK"));
  EXPECT_THAT(ok.out, HasSubstr(dir_ / "b"));
  testing::ToolRun other = Ctl({"--model_dir=" + dir_ / "a", "verify", "finetune"});
  EXPECT_EQ(other.rc, 1) << other.out;
  EXPECT_THAT(other.out, HasSubstr("verify FAILED"));
}

// Each way a file changes after loading: never a hit, `stale` naming the change, counted;
// with a load allowed, the new bytes (or the new file's error) instead.
TEST_F(IdentityTest, ChangedFilesAreStaleNeverAHit) {
  // Different seeds: four entries (identical contents would share one).
  uint64_t seed = 42;
  for (const char* m : {"inplace", "replaced", "truncated", "deleted"}) Write(m, seed++);
  Write("other", 7);
  Start("models:\n" + Spec("inplace", "inplace") + Spec("replaced", "replaced") +
        Spec("truncated", "truncated") + Spec("deleted", "deleted"));
  for (const char* m : {"inplace", "replaced", "truncated", "deleted"}) {
    ASSERT_TRUE(Acquire(m).ok()) << m;
  }
  // In place: one byte of q_proj flipped, same size, mtime set back.
  {
    const std::string p = dir_ / "inplace/model.safetensors";
    struct stat before {};
    ASSERT_EQ(::stat(p.c_str(), &before), 0);
    auto ckpt = safetensors::Checkpoint::Open(dir_ / "inplace");
    ASSERT_TRUE(ckpt.ok());
    const uint64_t at = ckpt->Find(kTensor)->file_offset;
    int fd = ::open(p.c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    char b = 0;
    ASSERT_EQ(::pread(fd, &b, 1, static_cast<off_t>(at)), 1);
    b = static_cast<char>(b ^ 0x5a);
    ASSERT_EQ(::pwrite(fd, &b, 1, static_cast<off_t>(at)), 1);
    ::close(fd);
    struct timespec times[2] = {before.st_atim, before.st_mtim};
    ASSERT_EQ(::utimensat(AT_FDCWD, p.c_str(), times, 0), 0);
  }
  std::filesystem::rename(dir_ / "other/model.safetensors", dir_ / "replaced/model.safetensors");
  ASSERT_EQ(::truncate((dir_ / "truncated/model.safetensors").c_str(), 1000), 0);
  std::filesystem::remove(dir_ / "deleted/model.safetensors");

  const std::map<std::string, std::string> want = {
      {"inplace", "model.safetensors: rewritten in place (changed "},
      {"replaced", "model.safetensors: replaced by another file (inode "},
      {"truncated", " -> 1000, modified "},
      {"deleted", "model.safetensors: deleted"}};
  for (const auto& [m, what] : want) {
    auto l = Acquire(m);
    ASSERT_FALSE(l.ok()) << m << " was served from stale weights";
    EXPECT_EQ(l.status().code(), absl::StatusCode::kFailedPrecondition) << m;
    EXPECT_THAT(std::string(l.status().message()), StartsWith("stale: model '" + m + "': "));
    EXPECT_THAT(std::string(l.status().message()), HasSubstr(what)) << m;
  }
  auto st = client_->Status();
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->acquire_stale(), 4u);
  int stale = 0;
  for (const auto& e : st->entries()) stale += e.state() == "stale" ? 1 : 0;
  EXPECT_EQ(stale, 4) << st->DebugString();

  // A load allowed: the new contents, never the old.
  auto inplace = Acquire("inplace", /*load=*/true);
  ASSERT_TRUE(inplace.ok()) << inplace.status();
  EXPECT_EQ(Mapped(**inplace, kTensor), DiskBytes(dir_ / "inplace", kTensor));
  auto replaced = Acquire("replaced", /*load=*/true);
  ASSERT_TRUE(replaced.ok()) << replaced.status();
  EXPECT_EQ(Mapped(**replaced, kTensor), DiskBytes(dir_ / "replaced", kTensor));
  auto truncated = Acquire("truncated", /*load=*/true);
  EXPECT_FALSE(truncated.ok());
  EXPECT_THAT(std::string(truncated.status().message()), HasSubstr("model.safetensors"));
  auto deleted = Acquire("deleted", /*load=*/true);
  EXPECT_FALSE(deleted.ok());
  EXPECT_THAT(std::string(deleted.status().message()), HasSubstr("deleted"));
  // The stale entries of the reloaded models were evicted with them.
  st = client_->Status();
  ASSERT_TRUE(st.ok());
  for (const auto& e : st->entries()) {
    if (e.model() == "inplace" || e.model() == "replaced") {
      EXPECT_EQ(e.state(), "ready");
    }
  }
}

TEST_F(IdentityTest, IdentitySurvivesARestartWithoutHashingAgain) {
  Write("a", 42);
  const uint64_t size = std::filesystem::file_size(dir_ / "a/model.safetensors");
  Start("models:\n" + Spec("m", "a"));
  auto st = WaitStatus(
      [](const auto& s) { return s.entries_size() == 1 && s.entries(0).state() == "ready"; });
  EXPECT_EQ(st.hashed_bytes(), size);
  const std::string fp = st.entries(0).fingerprint();
  struct stat store {};
  // Beside the socket dir that engines mount, never in it.
  ASSERT_EQ(::stat((socket_dir() + "-state/digests.json").c_str(), &store), 0);
  EXPECT_FALSE(std::filesystem::exists(socket_dir() + "/state"));
  EXPECT_EQ(store.st_mode & 0777, 0600u);
  Stop();
  Start("models:\n" + Spec("m", "a"));
  st = WaitStatus(
      [](const auto& s) { return s.entries_size() == 1 && s.entries(0).state() == "ready"; });
  EXPECT_EQ(st.hashed_bytes(), 0u);  // the digest came from the store
  EXPECT_EQ(st.entries(0).fingerprint(), fp);
}

TEST_F(IdentityTest, LoadLoadsEveryRankAndAMissingRankIsAMissListingTheCachedOnes) {
  Write("a", 42);
  Start("models:\n" + Spec("tp2", "a", 2) + Spec("tp4", "a", 4), {"--preload=false"});
  testing::ToolRun load = Ctl({"load", "tp2"});
  EXPECT_EQ(load.rc, 0) << load.out;
  EXPECT_THAT(load.out, HasSubstr("loading tp2: tp ranks 0,1 of 2"));
  EXPECT_THAT(load.out, HasSubstr("tp 1/2 pp 0/1 on host"));
  for (int r : {0, 1}) EXPECT_TRUE(Acquire("tp2", false, 2, r).ok()) << r;
  // One rank only, on request.
  testing::ToolRun one = Ctl({"--tp_size=4", "--tp_rank=0", "load", "tp4"});
  EXPECT_EQ(one.rc, 0) << one.out;
  auto rank3 = Acquire("tp4", false, 4, 3);
  ASSERT_EQ(rank3.status().code(), absl::StatusCode::kNotFound) << rank3.status();
  EXPECT_THAT(std::string(rank3.status().message()), HasSubstr("cached tp ranks: 0;"));
  auto st = client_->Status();
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->acquire_mismatches(), 0u);
  EXPECT_EQ(st->entries_size(), 3);
  // Sorted by model and rank.
  EXPECT_EQ(st->entries(0).model(), "tp2");
  EXPECT_EQ(st->entries(0).layout().tp_rank(), 0u);
  EXPECT_EQ(st->entries(1).layout().tp_rank(), 1u);
  EXPECT_EQ(st->entries(2).model(), "tp4");
}

TEST_F(IdentityTest, NamesSharingAnEntryAndEvictionByExactSpec) {
  Write("a", 42);
  Start("models:\n" + Spec("llama", "a") + Spec("alias", "a") + Spec("llama-tp2", "a", 2));
  auto st = WaitStatus([](const auto& s) {
    int ready = 0;
    for (const auto& e : s.entries()) ready += e.state() == "ready" ? 1 : 0;
    return ready == 3;
  });
  // The tp 1 entry is served under both names; status says so.
  bool found = false;
  for (const auto& e : st.entries()) {
    if (e.layout().tp_size() == 1) {
      found = true;
      EXPECT_EQ(std::vector<std::string>(e.names().begin(), e.names().end()),
                (std::vector<std::string>{"alias", "llama"}));
      EXPECT_GT(e.bytes(), 0u);
      EXPECT_GT(e.tensor_bytes(), 0u);
      EXPECT_LE(e.tensor_bytes(), e.bytes());
    }
  }
  EXPECT_TRUE(found);
  // Acquire by a name labels the lease with that name.
  auto by_alias = Acquire("alias");
  ASSERT_TRUE(by_alias.ok());
  EXPECT_EQ((*by_alias)->model(), "alias");
  by_alias->reset();

  // evict llama-tp2 (the operator, on the admin socket): its two ranks only, never the tp 1
  // entry.
  auto admin = testing::AdminClient(socket_dir());
  ASSERT_TRUE(admin);
  auto tp2 = admin->EvictDetailed("llama-tp2", "");
  ASSERT_TRUE(tp2.ok()) << tp2.status();
  EXPECT_EQ(tp2->evicted(), 2u);
  EXPECT_EQ(tp2->other_names_size(), 0);
  EXPECT_TRUE(Acquire("llama").ok());

  // The shared entry, still mapped by a client: alias evicts it, llama loses it, and it
  // drains (visible, with its lease and bytes) until the lease ends.
  auto held = Acquire("llama");
  ASSERT_TRUE(held.ok());
  auto ev = admin->EvictDetailed("alias", "");
  ASSERT_TRUE(ev.ok()) << ev.status();
  EXPECT_EQ(ev->evicted(), 1u);
  EXPECT_EQ(ev->draining(), 1u);
  ASSERT_EQ(ev->other_names_size(), 1);
  EXPECT_EQ(ev->other_names(0), "llama");
  st = WaitStatus([](const auto& s) { return s.entries_size() == 1; });
  EXPECT_EQ(st.entries(0).state(), "draining");
  EXPECT_EQ(st.entries(0).lease_count(), 1u);
  EXPECT_GT(st.entries(0).bytes(), 0u);
  EXPECT_EQ(Acquire("llama").status().code(), absl::StatusCode::kNotFound);
  held->reset();  // the lease ends: the entry goes
  WaitStatus([](const auto& s) { return s.entries_size() == 0; });
}

TEST_F(IdentityTest, HelpAndListSayWhatUsersNeed) {
  testing::ToolRun d = testing::RunTool({WEIGHTCACHED_PATH, "--help"}, dir_ / "d.err");
  EXPECT_EQ(d.rc, 0) << d.out;
  EXPECT_THAT(d.out, HasSubstr("--socket_dir"));
  EXPECT_THAT(d.out, HasSubstr("--digest_store"));
  EXPECT_THAT(d.out, ::testing::Not(HasSubstr("No flags matched")));
  testing::ToolRun c = testing::RunTool({WEIGHTCACHECTL_PATH, "--help"}, dir_ / "c.err");
  EXPECT_EQ(c.rc, 0) << c.out;
  for (const char* want : {"status", "list", "load", "evict", "verify", "--tp_rank", "--socket"}) {
    EXPECT_THAT(c.out, HasSubstr(want));
  }

  Write("a", 42);
  Write("awq", 42);
  std::ofstream(dir_ / "awq/config.json", std::ios::trunc)
      << R"({"architectures":["LlamaForCausalLM"],"quantization_config":{"quant_method":"awq"}})";
  Start("models:\n" + Spec("llama", "a") + Spec("tp2", "a", 2) + Spec("awq", "awq"),
        {"--preload=false"});
  ASSERT_TRUE(Acquire("llama", /*load=*/true).ok());
  EXPECT_FALSE(Acquire("awq").ok());
  testing::ToolRun list = Ctl({"list"});
  EXPECT_EQ(list.rc, 0) << list.out;
  EXPECT_THAT(list.out, ::testing::ContainsRegex("llama +1 +1 +auto +hf +0 +" + dir_ / "a"));
  EXPECT_THAT(list.out, ::testing::ContainsRegex("tp2 +2 +1 +auto +hf +- "));
  EXPECT_THAT(list.out, ::testing::ContainsRegex("awq .* refused "));
  EXPECT_THAT(list.out, HasSubstr("refused: "));
  EXPECT_THAT(list.out, HasSubstr("awq"));
  // status labels what its byte columns count.
  testing::ToolRun status = Ctl({"status"});
  EXPECT_THAT(status.out, HasSubstr("RESIDENT"));
  EXPECT_THAT(status.out, HasSubstr("TENSOR BYTES"));
  // A load that fails before reading prints no progress line.
  testing::ToolRun bad = Ctl({"load", "awq"});
  EXPECT_EQ(bad.rc, 2);
  EXPECT_THAT(bad.out, ::testing::Not(HasSubstr("0.0%")));
  EXPECT_THAT(bad.out, HasSubstr("awq"));
}

// Issue 48, pinned digests: `pin` prints the block of a model this node hashed; a daemon
// given it names the same weights without reading a byte (the fingerprint it looks the
// model up by comes from the pins: hashed_bytes stays 0), and its load, which reads the
// files anyway, checks them and keys the entry by the same fingerprint as the hashing node.
TEST_F(IdentityTest, PinPrintsTheDigestsAndAPinnedDaemonNamesTheSameWeightsWithoutHashing) {
  Write("a", 42);
  const std::string file = dir_ / "a/model.safetensors";
  const uint64_t size = std::filesystem::file_size(file);
  Start("models:\n" + Spec("m", "a"));
  auto st = WaitStatus(
      [](const auto& s) { return s.entries_size() == 1 && s.entries(0).state() == "ready"; });
  EXPECT_EQ(st.hashed_bytes(), size);
  const std::string hashed_fp = st.entries(0).fingerprint();
  testing::ToolRun pin = AdminCtl({"pin", "m"});
  ASSERT_EQ(pin.rc, 0) << pin.out;
  const std::string line = "  model.safetensors: " + Sha256Of(file) + "\n";
  EXPECT_THAT(pin.out, HasSubstr("\ndigests:\n" + line)) << pin.out;
  // And each segment's cryptographic digest per fingerprint held (issue 48): the block a
  // spec pins for peer fills. Another node that loads the same fingerprint computes the same.
  const size_t seg_at = pin.out.find("\nsegment_digests:\n  " + hashed_fp + ":");
  ASSERT_NE(seg_at, std::string::npos) << pin.out;
  const std::string segments = pin.out.substr(seg_at);
  EXPECT_THAT(segments, ::testing::ContainsRegex("\n    - [0-9a-f]{64}\n")) << pin.out;
  // Engines are not told (admin only).
  testing::ToolRun engine = Ctl({"pin", "m"});
  EXPECT_EQ(engine.rc, 2);
  EXPECT_THAT(engine.out, HasSubstr("admins only"));
  Stop();

  // Another node: the block pasted into its spec, an empty digest store, nothing preloaded.
  std::string pinned = "models:\n" + Spec("m", "a") + "    digests:\n    " + line;
  Start(pinned, {"--preload=false", "--digest_store=" + dir_ / "other-state/digests.json"});
  auto miss = Acquire("m");
  EXPECT_FALSE(miss.ok());
  auto cold = client_->Status();
  ASSERT_TRUE(cold.ok());
  EXPECT_EQ(cold->hashed_bytes(), 0u);  // the model was opened and named, not a byte hashed
  testing::ToolRun told = AdminCtl({"pin", "m"});
  EXPECT_EQ(told.rc, 0) << told.out;
  EXPECT_THAT(told.out,
              HasSubstr(Sha256Of(file) + "  # the spec's own pin: not read on this node"));
  auto loaded = Acquire("m", /*load=*/true);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ((*loaded)->fingerprint(), hashed_fp);
  EXPECT_EQ(Mapped(**loaded, kTensor), DiskBytes(dir_ / "a", kTensor));
  auto after = client_->Status();
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->hashed_bytes(), size);  // the load checked the pin, once
  testing::ToolRun again = AdminCtl({"pin", "m"});
  ASSERT_EQ(again.rc, 0) << again.out;
  EXPECT_THAT(again.out, HasSubstr(segments)) << again.out;
}

// A load whose files hash otherwise than pinned is refused naming the file and both digests
// (Status, log, metric); the entry never becomes ready and nothing else is lost.
TEST_F(IdentityTest, FilesThatHashOtherwiseThanPinnedAreRefusedAndNothingElseIsLost) {
  Write("a", 42);
  Write("b", 43);  // a "fine-tune": same file names, other bytes
  const std::string a = Sha256Of(dir_ / "a/model.safetensors");
  const std::string b = Sha256Of(dir_ / "b/model.safetensors");
  const std::string pins = "    digests: {model.safetensors: " + a + "}\n";
  // "bad" names other weights than "good" (a revision of its own): had it the same identity,
  // "good"'s verified copy would serve it, which is right but not what is tested here.
  Start("models:\n" + Spec("good", "a") + pins + Spec("bad", "b") + pins + "    revision: other\n" +
            Spec("plain", "b"),
        {"--metrics_address=127.0.0.1:0"});
  auto st = WaitStatus([](const auto& s) {
    int settled = 0;
    for (const auto& e : s.entries()) settled += e.state() == "ready" || e.state() == "failed";
    return settled == 3;
  });
  const std::string why =
      "model 'bad': pinned digest mismatch: model.safetensors hashes to "
      "sha256:" +
      b + " but the spec pins sha256:" + a +
      "; refused: the file is not the checkpoint the spec names";
  for (const auto& e : st.entries()) {
    if (e.model() == "bad") {
      EXPECT_EQ(e.state(), "failed");
      EXPECT_EQ(e.error(), why);
    } else {
      EXPECT_EQ(e.state(), "ready") << e.model() << ": " << e.error();
    }
  }
  auto bad = Acquire("bad");
  EXPECT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("pinned digest mismatch"));
  auto good = Acquire("good");
  ASSERT_TRUE(good.ok()) << good.status();
  EXPECT_EQ(Mapped(**good, kTensor), DiskBytes(dir_ / "a", kTensor));
  auto plain = Acquire("plain");  // the same bytes as "bad", unpinned: served
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(Mapped(**plain, kTensor), DiskBytes(dir_ / "b", kTensor));
  EXPECT_THAT(testing::ReadFileOrEmpty(dir_ / "daemon.log"), HasSubstr(why));
  const int port = testing::MetricsPort(dir_ / "daemon.log");
  ASSERT_GT(port, 0);
  EXPECT_THAT(testing::Scrape(port),
              HasSubstr("weightcache_pinned_digest_mismatches_total{model=\"bad\"} 1"));
}

// Bad pins: a malformed digest stops the spec file at load (the daemon does not start),
// naming the model and the file; pins that do not cover the checkpoint refuse that model
// (list says why), the others are served.
TEST_F(IdentityTest, MalformedOrIncompletePinsAreClearErrors) {
  Write("a", 42);
  std::ofstream(dir_ / "bad.yaml") << "models:\n"
                                   << Spec("m", "a") << "    digests: {model.safetensors: 12ab}\n";
  testing::ToolRun d =
      testing::RunTool({WEIGHTCACHED_PATH, "--socket_dir=" + socket_dir(), "--backend=host",
                        "--metrics_address=off", "--spec_file=" + dir_ / "bad.yaml"},
                       dir_ / "d.err");
  EXPECT_NE(d.rc, 0);
  EXPECT_THAT(d.out, HasSubstr("models[0].digests[\"model.safetensors\"]: model \"m\": must be "
                               "the file's SHA-256, 64 hex digits, got \"12ab\" (4 characters)"));
  const std::string sha = Sha256Of(dir_ / "a/model.safetensors");
  Start("models:\n" + Spec("extra", "a") + "    digests: {model.safetensors: " + sha +
            ", model-2.safetensors: " + sha + "}\n" + Spec("ok", "a"),
        {"--preload=false"});
  auto extra = Acquire("extra", /*load=*/true);
  ASSERT_FALSE(extra.ok());
  EXPECT_THAT(std::string(extra.status().message()),
              HasSubstr("model 'extra': digests: a digest is pinned for \"model-2.safetensors\", "
                        "which is not a checkpoint file of " +
                        dir_ / "a"));
  testing::ToolRun list = Ctl({"list"});
  EXPECT_THAT(list.out, HasSubstr("refused: model 'extra': digests: a digest is pinned for"));
  EXPECT_TRUE(Acquire("ok", /*load=*/true).ok());
}

}  // namespace
}  // namespace weightcache
