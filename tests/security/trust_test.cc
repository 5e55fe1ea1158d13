// The node's trust boundary, one attack per test (issue 25). The attacker is an engine pod
// running as root (the common case) with the mount the device plugin gives it; the daemon
// runs with the Helm chart's default flags. Each test states the attack, then the answer.
//
// The whole list, here and where a unit owns the answer:
//   root engine is admin/publisher by default     ARootEngineIsNeitherAdminNorPublisherByDefault
//   replace the sockets through the mount         ThroughAReadOnlyMountEnginesConnectButCannot...
//   rewrite the digest store in the mount         TheEnginesDirectoryHoldsOnlySockets
//   forge the digest store's entries              pkg/identity DigestStoreTest.ATamperedStore...
//   shard or config.json linked out of the roots  AFileLinkedOutOfTheModelRootsIsRefused
//   blob named after another model's bytes        ABlobNamedAfterAnotherModelsBytesIsRefused
//   placement flood (layouts, environments)       AnEngineCannotFloodTheNodeWithLayouts...
//   keep memory after a lease, evict, reload      MemoryKeptAfterALeaseStaysCountedAgainst...
//   revoked model back from the keeper            ARevokedModelDoesNotComeBackFromTheKeeper
//   another uid serves the keeper socket first    KeeperImpostorOfAnotherUidGetsNothing...
//   a daemon of another uid at the keeper         pkg/keeper KeeperTest.KeeperImpostorDaemon...
//   squat spawn mode's directory                  python/tests/test_modes.py
//                                                 test_spawn_mode_refuses_a_directory_that_...
//   numeric webhook limit makes pods unschedulable  pkg/webhook Mutate.ANumericLimitIsCopied...
//   publish through a slot of another namespace   tests/integration/namespace_test.cc
//   the rule table (roles granted, never implied) pkg/server/policy/policy_test.cc
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "pkg/identity/identity.h"
#include "pkg/keeper/client.h"
#include "pkg/probes/node_probes.h"
#include "pkg/safetensors/writer.h"
#include "pkg/util/scoped_fd.h"
#include "tests/integration/daemon_harness.h"
#include "tests/integration/process.h"
#include "tests/testutil/temp_dir.h"
#include "weightcache/v1/weightcache.pb.h"

namespace weightcache {
namespace {

using namespace std::chrono_literals;
using ::testing::HasSubstr;
using testing::Process;
using testing::TempDir;

class TrustTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(safetensors::WriteLlamaCheckpoint(dir_ / "m", testing::SmallLlama()).ok());
  }
  // The chart's defaults as flags: no role flag at all.
  void Start() {
    auto d = testing::StartDaemon(
        {WEIGHTCACHED_PATH, "--socket_dir=" + socket_dir(), "--backend=host",
         "--metrics_address=off", "--model=name=m,model_dir=" + dir_ / "m"},
        socket_dir(), dir_ / "daemon.log",
        [](const auto& s) { return s.entries_size() == 1 && s.entries(0).state() == "ready"; });
    ASSERT_TRUE(d.ok()) << d.status();
    daemon_ = std::move(d->process);
    client_ = std::move(d->client);
  }
  testing::ToolRun Ctl(const std::string& socket, std::vector<std::string> args) {
    args.insert(args.begin(), {WEIGHTCACHECTL_PATH, "--socket=" + socket});
    return testing::RunTool(args, dir_ / "ctl.err");
  }
  std::string socket_dir() const { return dir_ / "s"; }

  TempDir dir_;
  std::unique_ptr<Process> daemon_;
  std::unique_ptr<client::Client> client_;
};

// Attack: a root engine on the shared engine socket evicts everyone's weights, redefines a
// model to point at its own directory, and publishes bytes of its choice for the others to
// map (before: root was admin and publisher by default, as the daemon's own uid).
// Answer: no role is implied; the operator's admin socket lies outside the engines' mount.
TEST_F(TrustTest, ARootEngineIsNeitherAdminNorPublisherByDefault) {
  if (::geteuid() != 0) GTEST_SKIP() << "the attacker is root: run as root";
  Start();
  const std::string engine = socket_dir() + "/control.sock";
  testing::ToolRun evict = Ctl(engine, {"evict", "m"});
  EXPECT_EQ(evict.rc, 2) << evict.out;
  EXPECT_THAT(evict.out, HasSubstr("uid 0 (gid 0) on the engine socket may not evict"));
  EXPECT_THAT(evict.out, HasSubstr("refused on " + engine));
  std::filesystem::create_directories(dir_ / "evil");
  std::ofstream(dir_ / "evil.yaml") << "name: m\nmodel_dir: " << dir_ / "evil"
                                    << "\n";
  testing::ToolRun redefine = Ctl(engine, {"--spec=" + dir_ / "evil.yaml", "load"});
  EXPECT_EQ(redefine.rc, 2) << redefine.out;
  EXPECT_THAT(redefine.out, HasSubstr("may not define models"));
  Process publisher({PUBLISH_CLIENT_PATH, socket_dir(), "m", "poisoned", "3", "commit"},
                    dir_ / "publisher.err");
  const std::string line = publisher.WaitFor("ERROR", 20s).value_or("");
  EXPECT_THAT(line, HasSubstr("PERMISSION_DENIED"));
  EXPECT_THAT(line, HasSubstr("may not publish weights"));
  publisher.CloseStdin();
  publisher.Wait();
  // Nothing changed: one entry, the disk's, still served.
  auto st = client_->Status();
  ASSERT_TRUE(st.ok());
  ASSERT_EQ(st->entries_size(), 1);
  EXPECT_EQ(st->entries(0).source(), "disk");
  EXPECT_EQ(st->entries(0).state(), "ready");

  // The operator's socket: beside the engines' directory (never inside what they mount),
  // the daemon's alone, and admin there.
  const std::string admin_dir = socket_dir() + "-admin";
  struct stat ds {};
  ASSERT_EQ(::stat(admin_dir.c_str(), &ds), 0);
  EXPECT_EQ(ds.st_mode & 0777, 0700u);
  EXPECT_EQ(ds.st_uid, ::geteuid());
  testing::ToolRun admin = Ctl(admin_dir, {"evict", "m"});
  EXPECT_EQ(admin.rc, 0) << admin.out;
}

// Attack: with the socket directory mounted read-write, a root engine (it keeps
// CAP_DAC_OVERRIDE) unlinks control.sock and binds its own: later engines map its weights.
// Answer: the device plugin mounts the directory read-only (device_plugin_test checks the
// mount it hands out); through such a mount connect(2) works and unlink fails.
TEST_F(TrustTest, ThroughAReadOnlyMountEnginesConnectButCannotReplaceTheSockets) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root for a mount namespace";
  Start();
  const std::string mnt = dir_ / "engine-view";
  std::filesystem::create_directories(mnt);
  // An engine's view: a private mount namespace with the socket dir bound read-only.
  const std::string script =
      "set -u; mount --bind '" + socket_dir() + "' '" + mnt + "' && mount -o remount,bind,ro '" +
      mnt + "' || { echo MOUNT-FAILED; exit 0; }; '" + WEIGHTCACHECTL_PATH + "' --socket='" + mnt +
      "' status >/dev/null 2>&1; echo status=$?; rm -f '" + mnt +
      "/control.sock' 2>&1; echo rm=$?; touch '" + mnt + "/handle.sock.new' 2>&1; echo touch=$?";
  testing::ToolRun r =
      testing::RunTool({"/usr/bin/unshare", "-m", "/bin/sh", "-c", script}, dir_ / "unshare.err");
  if (r.out.find("MOUNT-FAILED") != std::string::npos) {
    GTEST_SKIP() << "no mount namespace here: " << r.out;
  }
  EXPECT_THAT(r.out, HasSubstr("status=0"));
  EXPECT_THAT(r.out, HasSubstr("Read-only file system"));
  EXPECT_THAT(r.out, HasSubstr("rm=1"));
  EXPECT_THAT(r.out, HasSubstr("touch=1"));
  struct stat st {};
  ASSERT_EQ(::lstat((socket_dir() + "/control.sock").c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_TRUE(client_->Status().ok());
}

// Attack: the digest store lived in <socket_dir>/state/, which every engine mounted: an
// engine could assign any digest to any file version. Answer: the engines' directory holds
// the sockets and nothing else of the daemon's; daemon state lives beside it. The one file
// there is for engines: the node's probe decision (issue 49), 0644, which they believe only
// when it matches their own CPU.
TEST_F(TrustTest, TheEnginesDirectoryHoldsOnlySockets) {
  Start();
  EXPECT_TRUE(std::filesystem::exists(socket_dir() + "/" + probes::kNodeProbesFile));
  for (const auto& f : std::filesystem::recursive_directory_iterator(socket_dir())) {
    if (f.path().filename() == probes::kNodeProbesFile) {
      EXPECT_EQ(f.status().permissions(), std::filesystem::perms(0644)) << f.path();
      continue;
    }
    EXPECT_TRUE(f.is_socket() || f.is_directory()) << f.path() << " is in the engines' mount";
  }
  EXPECT_TRUE(std::filesystem::exists(socket_dir() + "-state/digests.json"));
}

// Attack: --model_roots checked the model directory only; a shard symlink inside it was
// followed anywhere, so a tenant who may write a model directory under the roots had a file
// of another team's (outside the roots) served under its own spec. The same for a linked
// config.json. Answer: every file the loader may read resolves under the roots, or the
// model is refused naming the file and where it leads.
TEST_F(TrustTest, AFileLinkedOutOfTheModelRootsIsRefused) {
  const std::string roots = dir_ / "roots";
  ASSERT_TRUE(safetensors::WriteLlamaCheckpoint(dir_ / "other-team", testing::SmallLlama()).ok());
  for (const std::string leak : {"model.safetensors", "config.json"}) {
    const std::string mine = roots + "/mine-" + leak;
    std::filesystem::create_directories(mine);
    for (const std::string f : {"model.safetensors", "config.json"}) {
      if (f == leak) {
        std::filesystem::create_symlink(dir_ / ("other-team/" + f), mine + "/" + f);
      } else {
        std::filesystem::copy_file(dir_ / ("other-team/" + f), mine + "/" + f);
      }
    }
  }
  std::ofstream(dir_ / "specs.yaml")
      << "models:\n  - {name: a, model_dir: " << roots
      << "/mine-model.safetensors}\n  - {name: b, model_dir: " << roots << "/mine-config.json}\n";
  auto d = testing::StartDaemon(
      {WEIGHTCACHED_PATH, "--socket_dir=" + socket_dir(), "--backend=host", "--metrics_address=off",
       "--preload=false", "--spec_file=" + dir_ / "specs.yaml", "--model_roots=" + roots},
      socket_dir(), dir_ / "daemon.log");
  ASSERT_TRUE(d.ok()) << d.status();
  for (const std::string name : {"a", "b"}) {
    client::AcquireOptions o;
    o.model = name;
    o.load_on_miss = true;
    auto got = d->client->Acquire(o);
    EXPECT_EQ(got.status().code(), absl::StatusCode::kPermissionDenied) << name << got.status();
    EXPECT_THAT(std::string(got.status().message()),
                HasSubstr("(resolves to " + dir_ / "other-team/"))
        << name;
    EXPECT_THAT(std::string(got.status().message()),
                HasSubstr("is not under the daemon's --model_roots"));
  }
  auto st = d->client->Status();
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->entries_size(), 0);  // nothing was read
}

// Attack: a file whose link target is named blobs/<64 hex> was given the digest
// sha256:<that name> without a byte read. A tenant who writes a model directory names its
// poisoned bytes after another team's public model (same file names and sizes, same
// config.json): the other team's Acquire computes the same fingerprint and hits the
// poisoned entry. Answer: the name is verified against the bytes (SHA-256), and a blob whose
// name lies is refused, naming it.
TEST_F(TrustTest, ABlobNamedAfterAnotherModelsBytesIsRefused) {
  // The public model, as the Hugging Face hub cache lays it out.
  const std::string pub = dir_ / "hub/models--org--m";
  std::filesystem::create_directories(pub + "/blobs");
  std::filesystem::create_directories(pub + "/snapshots/rev");
  ScopedFd real(::open((dir_ / "m/model.safetensors").c_str(), O_RDONLY | O_CLOEXEC));
  auto sha = identity::Sha256File(
      real.get(), std::filesystem::file_size(dir_ / "m/model.safetensors"), "model.safetensors");
  ASSERT_TRUE(sha.ok()) << sha.status();
  std::filesystem::copy_file(dir_ / "m/model.safetensors", pub + "/blobs/" + *sha);
  std::filesystem::create_symlink("../../blobs/" + *sha, pub + "/snapshots/rev/model.safetensors");
  std::filesystem::copy_file(dir_ / "m/config.json", pub + "/snapshots/rev/config.json");
  // The attacker's copy: same names, same header and size, other weights, under the same
  // blob name.
  safetensors::LlamaShape other = testing::SmallLlama();
  other.seed = 99;
  ASSERT_TRUE(safetensors::WriteLlamaCheckpoint(dir_ / "poison", other).ok());
  const std::string evil = dir_ / "hub/models--evil--m";
  std::filesystem::create_directories(evil + "/blobs");
  std::filesystem::create_directories(evil + "/snapshots/rev");
  std::filesystem::copy_file(dir_ / "poison/model.safetensors", evil + "/blobs/" + *sha);
  std::filesystem::create_symlink("../../blobs/" + *sha, evil + "/snapshots/rev/model.safetensors");
  std::filesystem::copy_file(dir_ / "m/config.json", evil + "/snapshots/rev/config.json");
  ASSERT_EQ(std::filesystem::file_size(evil + "/blobs/" + *sha),
            std::filesystem::file_size(pub + "/blobs/" + *sha));

  std::ofstream(dir_ / "specs.yaml")
      << "models:\n  - {name: evil, model_dir: " << evil
      << "/snapshots/rev}\n  - {name: public, model_dir: " << pub << "/snapshots/rev}\n";
  auto d = testing::StartDaemon(
      {WEIGHTCACHED_PATH, "--socket_dir=" + socket_dir(), "--backend=host", "--metrics_address=off",
       "--preload=false", "--spec_file=" + dir_ / "specs.yaml"},
      socket_dir(), dir_ / "daemon.log");
  ASSERT_TRUE(d.ok()) << d.status();
  client::AcquireOptions o;
  o.model = "evil";  // the attacker loads first
  o.load_on_miss = true;
  auto poisoned = d->client->Acquire(o);
  EXPECT_EQ(poisoned.status().code(), absl::StatusCode::kDataLoss) << poisoned.status();
  EXPECT_THAT(std::string(poisoned.status().message()),
              HasSubstr("its Hugging Face blob name says sha256:" + *sha));
  o.model = "public";
  auto served = d->client->Acquire(o);
  ASSERT_TRUE(served.ok()) << served.status();
  auto st = d->client->Status();
  ASSERT_TRUE(st.ok());
  ASSERT_EQ(st->entries_size(), 1);
  EXPECT_EQ(st->entries(0).model(), "public");
}

// Attack: with the default budget any engine loaded a known model in any layout (tp_size,
// rank) and environment (a compute capability of its choice) on any GPU, each a new entry
// never evicted, until the GPUs were full for everyone. Answer: engines load only what the
// spec declares, at the device's own environment; the rest needs an admin.
TEST_F(TrustTest, AnEngineCannotFloodTheNodeWithLayoutsTheSpecDoesNotDeclare) {
  Start();  // m: tp_size 1, already loaded
  const std::string who = "on the engine socket may not load model 'm' so: ";
  for (int tp = 2; tp <= 8; tp *= 2) {
    v1::Layout layout;
    layout.set_tp_size(tp);
    layout.set_tp_rank(tp - 1);
    absl::Status s = client_->Load(
        "m", "", [](const v1::LoadProgress&) {}, &layout);
    EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr(who));
    EXPECT_THAT(std::string(s.message()),
                HasSubstr(absl::StrCat("layout tp ", tp - 1, "/", tp,
                                       " pp 0/1 is not its spec's (tp_size 1, pp 0/1)")));
  }
  for (const std::string cc : {"sm_80", "sm_90", "sm_100"}) {  // the device is "cpu"
    client::AcquireOptions o;
    o.model = "m";
    o.compute_capability = cc;
    o.load_on_miss = true;
    auto got = client_->Acquire(o);
    EXPECT_EQ(got.status().code(), absl::StatusCode::kPermissionDenied) << got.status();
    EXPECT_THAT(std::string(got.status().message()),
                HasSubstr("compute_capability " + cc + " is not that of device host (cpu)"));
  }
  auto st = client_->Status();
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->entries_size(), 1);  // nothing was placed
  // What the spec declares still loads for an engine; an admin may place anything else.
  EXPECT_TRUE(client_->Load("m", "", [](const v1::LoadProgress&) {}).ok());
  auto admin = testing::AdminClient(socket_dir());
  v1::Layout two;
  two.set_tp_size(2);
  absl::Status placed = admin->Load(
      "m", "", [](const v1::LoadProgress&) {}, &two);
  EXPECT_TRUE(placed.ok()) << placed;
  st = client_->Status();
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->entries_size(), 2);
}

// Attack: an engine ends its lease but keeps the memory (a duplicate of the mapping, as good
// as keeping the descriptors); the entry is evicted and loaded again, and again: each round
// leaves a copy the budget no longer counts (tried before: Status 124 MiB, shared memory
// 884 MiB, budget 150 MiB). Answer: an evicted copy counts against the budget until its last
// holder lets go (host backend: the kernel says when, through inotify).
TEST_F(TrustTest, MemoryKeptAfterALeaseStaysCountedAgainstTheBudget) {
  Start();  // to learn the entry's size
  auto first = client_->Status();
  ASSERT_TRUE(first.ok());
  const uint64_t size = first->entries(0).bytes();
  client_.reset();
  daemon_->Kill(SIGTERM);
  ASSERT_EQ(daemon_->Wait(), 0);
  // Room for two copies and a half.
  auto d = testing::StartDaemon(
      {WEIGHTCACHED_PATH, "--socket_dir=" + socket_dir(), "--backend=host", "--metrics_address=off",
       "--model=name=m,model_dir=" + dir_ / "m", "--memory_budget=" + std::to_string(size * 5 / 2)},
      socket_dir(), dir_ / "daemon2.log",
      [](const auto& s) { return s.entries_size() == 1 && s.entries(0).state() == "ready"; });
  ASSERT_TRUE(d.ok()) << d.status();
  auto admin = testing::AdminClient(socket_dir());
  client::AcquireOptions o;
  o.model = "m";
  o.load_on_miss = true;
  std::vector<std::pair<void*, size_t>> kept;
  // Acquire, keep a mapping of every segment, end the lease; the admin evicts the entry.
  auto keep_and_evict = [&] {
    auto lease = d->client->Acquire(o);
    ASSERT_TRUE(lease.ok()) << lease.status();
    for (size_t i = 0; i < (*lease)->segment_count(); ++i) {
      auto* base = const_cast<std::byte*>((*lease)->segment_base(i));
      const size_t n = (*lease)->segment_size(i);
      void* dup = ::mremap(base, 0, n, MREMAP_MAYMOVE);  // a second mapping, same pages
      ASSERT_NE(dup, MAP_FAILED) << std::strerror(errno);
      kept.emplace_back(dup, n);
    }
    lease->reset();  // unmapped and the handle connection closed: the lease ends
    testing::WaitForStatus(
        *admin,
        [](const v1::StatusResponse& s) {
          return s.entries_size() == 1 && s.entries(0).lease_count() == 0;
        },
        10s);
    auto evicted = admin->Evict("m", "");
    ASSERT_TRUE(evicted.ok()) << evicted.status();
    EXPECT_EQ(*evicted, 1u);
    auto st = admin->Status();
    ASSERT_TRUE(st.ok());
    EXPECT_EQ(st->entries_size(), 0);  // gone from the registry: only the kept copy is left
  };
  keep_and_evict();
  auto again = d->client->Acquire(o);  // 1 kept + 1 loaded fit in 2.5
  ASSERT_TRUE(again.ok()) << again.status();
  again->reset();
  keep_and_evict();
  auto refused = d->client->Acquire(o);  // 2 kept + 1 do not
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted) << refused.status();
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr(absl::StrCat(2 * size,
                                     " bytes are evicted copies other processes still "
                                     "map or hold")));
  for (auto [p, n] : kept) ::munmap(p, n);  // really gone now
  auto after = d->client->Acquire(o);
  EXPECT_TRUE(after.ok()) << after.status();
}

// Attack: the operator revokes a model by removing it from the spec file; the daemon
// restarts (an upgrade, a crash) and the keeper still holds its bytes. Before, adoption
// brought every record back, and defined the model again from the spec recorded with it,
// with the access rules it had then. Answer: only models still in the spec file come back
// (under the file's current spec and rules), and inline specs an admin defined; the rest
// is dropped from the keeper, with the reason in Status.
TEST_F(TrustTest, ARevokedModelDoesNotComeBackFromTheKeeper) {
  safetensors::LlamaShape other = testing::SmallLlama();
  other.seed = 7;  // other bytes: its own entry
  ASSERT_TRUE(safetensors::WriteLlamaCheckpoint(dir_ / "r", other).ok());
  const std::string keeper_sock = dir_ / "k/keeper.sock";
  Process keeper({KEEPER_PATH, "--socket=" + keeper_sock}, dir_ / "keeper.log");
  for (int i = 0; i < 1000 && !keeper::KeeperClient::Connect(keeper_sock).ok(); ++i) {
    std::this_thread::sleep_for(10ms);  // polling a condition with a deadline
  }
  auto write_specs = [&](bool with_revoked) {
    std::ofstream(dir_ / "specs.yaml")
        << "models:\n  - {name: m, model_dir: " << dir_ / "m"
        << "}\n"
        << (with_revoked ? "  - {name: r, model_dir: " + dir_ / "r" + "}\n" : "");
  };
  const std::vector<std::string> argv = {WEIGHTCACHED_PATH,
                                         "--socket_dir=" + socket_dir(),
                                         "--backend=host",
                                         "--metrics_address=off",
                                         "--spec_file=" + dir_ / "specs.yaml",
                                         "--keeper_socket=" + keeper_sock};
  auto ready = [](int n) {
    return [n](const v1::StatusResponse& s) {
      int ready = 0;
      for (const auto& e : s.entries()) ready += e.state() == "ready";
      return ready == n;
    };
  };
  write_specs(true);
  auto d = testing::StartDaemon(argv, socket_dir(), dir_ / "daemon.log", ready(2));
  ASSERT_TRUE(d.ok()) << d.status();
  // And an admin's inline spec, which is not in the file: it stays.
  std::ofstream(dir_ / "inline.yaml") << "name: x\nmodel_dir: " << dir_ / "m"
                                      << "\ntp_size: 2\n";
  testing::ToolRun define =
      Ctl(socket_dir() + "-admin", {"--spec=" + dir_ / "inline.yaml", "load"});
  ASSERT_EQ(define.rc, 0) << define.out;
  // Deposits follow readiness: wait until the keeper holds all four.
  testing::WaitForStatus(
      *d->client,
      [](const v1::StatusResponse& s) {
        return s.keeper().up() && s.keeper().pending_entries() == 0;
      },
      20s);
  d->process->Kill(SIGKILL);
  d->process->Wait();

  write_specs(false);  // r revoked
  auto again = testing::StartDaemon(argv, socket_dir(), dir_ / "daemon2.log", ready(3));
  ASSERT_TRUE(again.ok()) << again.status() << testing::ReadFileOrEmpty(dir_ / "daemon2.log");
  auto st = again->client->Status();
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->keeper().adopted_entries(), 3u);  // m, and x's two ranks
  EXPECT_EQ(st->keeper().dropped_entries(), 1u);
  EXPECT_THAT(st->keeper().last_error(), HasSubstr("model 'r' is no longer configured"));
  for (const auto& e : st->entries()) {
    EXPECT_NE(e.model(), "r");
    EXPECT_EQ(e.source(), "keeper") << e.model();
  }
  client::AcquireOptions o;
  o.model = "r";
  auto revoked = again->client->Acquire(o);
  EXPECT_EQ(revoked.status().code(), absl::StatusCode::kNotFound) << revoked.status();
  auto stats = keeper::KeeperClient::Connect(keeper_sock).value()->Stats();
  EXPECT_THAT(stats.value_or(""), HasSubstr("entries=3 "));
}

// Attack: the keeper's socket directory is world-writable (1777, like /tmp): uid 65534 runs
// the real weightcache-keeper there before the node's keeper starts (letting the daemon's uid
// in), and offers an entry of its own. Before: the root daemon deposited every entry with it
// (uid 65534 then read every cached weight from the descriptors it held) and adopted what it
// offered. Answer: the daemon checks who serves the socket (SO_PEERCRED, its own uid or
// --keeper_uid) before anything crosses, and says so by name in its log, Status and metrics.
TEST_F(TrustTest, KeeperImpostorOfAnotherUidGetsNothingAndGivesNothing) {
  if (::geteuid() != 0) GTEST_SKIP() << "the daemon is root and the impostor uid 65534";
  ASSERT_EQ(::chmod(dir_.path().c_str(), 0711), 0);  // the impostor reaches k/
  const std::string shared = dir_ / "k";
  ASSERT_EQ(::mkdir(shared.c_str(), 0700), 0);
  ASSERT_EQ(::chmod(shared.c_str(), 01777), 0);
  const std::string sock = shared + "/keeper.sock";
  Process impostor({"/usr/bin/setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                    KEEPER_PATH, "--socket=" + sock, "--allowed_uids=0,65534"},
                   dir_ / "impostor.log");
  const auto offered = [&]() -> absl::StatusOr<std::unique_ptr<keeper::KeeperClient>> {
    return keeper::KeeperClient::Connect(sock, std::chrono::seconds(5), /*keeper_uid=*/65534);
  };
  for (int i = 0; i < 1000 && !offered().ok(); ++i) {
    std::this_thread::sleep_for(10ms);  // polling a condition with a deadline
  }
  {
    auto c = offered();
    ASSERT_TRUE(c.ok()) << c.status() << testing::ReadFileOrEmpty(dir_ / "impostor.log");
    ScopedFd planted(::memfd_create("planted", MFD_CLOEXEC));
    ASSERT_EQ(::ftruncate(planted.get(), 4096), 0);
    ASSERT_TRUE((*c)->Deposit("planted@host", "a record of its choosing",
                              {planted.get(), planted.get(), planted.get()})
                    .ok());
  }  // closed: the impostor serves the next daemon

  auto d =
      testing::StartDaemon({WEIGHTCACHED_PATH, "--socket_dir=" + socket_dir(), "--backend=host",
                            "--metrics_address=127.0.0.1:0", "--keeper_timeout=1",
                            "--keeper_socket=" + sock, "--model=name=m,model_dir=" + dir_ / "m"},
                           socket_dir(), dir_ / "daemon.log", [](const v1::StatusResponse& s) {
                             return s.entries_size() == 1 && s.entries(0).state() == "ready";
                           });
  ASSERT_TRUE(d.ok()) << d.status();
  // Refused (new), or deposited and in step (before): whichever comes first.
  const v1::StatusResponse st = testing::WaitForStatus(
      *d->client,
      [](const v1::StatusResponse& s) {
        return s.keeper().impostor_refusals() >= 2 ||
               (s.keeper().up() && s.keeper().pending_entries() == 0);
      },
      30s);
  EXPECT_FALSE(st.keeper().up());
  EXPECT_EQ(st.keeper().keeper_uid(), 0u);
  EXPECT_THAT(st.keeper().impostor(),
              HasSubstr("the keeper there runs as uid 65534 (pid " +
                        std::to_string(impostor.pid())));  // setpriv execs the keeper
  EXPECT_THAT(st.keeper().impostor(), HasSubstr("not the expected uid 0"));
  EXPECT_EQ(st.keeper().adopted_entries(), 0u);
  EXPECT_EQ(st.keeper().dropped_entries(), 0u);  // not even asked for what it held
  EXPECT_EQ(st.entries(0).source(), "disk");
  // The impostor holds its own entry (3 descriptors) and nothing of the daemon's.
  auto held = offered();
  ASSERT_TRUE(held.ok()) << held.status();
  EXPECT_THAT((*held)->Stats().value_or(""), HasSubstr("entries=1 fds=3 "))
      << "the daemon deposited with the impostor";
  EXPECT_TRUE(testing::WaitForLogLine(dir_ / "daemon.log", "an impostor", 10s));
  const std::string metrics = testing::Scrape(testing::MetricsPort(dir_ / "daemon.log"));
  EXPECT_THAT(metrics, ::testing::ContainsRegex(
                           "weightcache_keeper_impostors_total\\{expected_uid=\"0\",found_uid="
                           "\"65534\"\\} [1-9]"));
}

}  // namespace
}  // namespace weightcache
