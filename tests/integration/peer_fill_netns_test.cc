// Peer fill (issue 30) between real daemons, each in its own network namespace: a bridge in a
// hub namespace joins them through veth pairs (made by the test as root, deleted after; the
// host's own network is never touched). Each daemon has its own socket directory and talks to
// the others over TCP only: the peer API with mutual TLS, UCX over TCP for the bytes.
//  - a cold daemon fills from a holder: every tensor equal to the checkpoint, and the process
//    read (rchar) no checkpoint bytes (identity from a copy of the holder's digest store);
//  - the holder SIGKILLed mid-transfer (its link throttled so the pull takes seconds): the
//    fill falls back to disk, the bytes are the checkpoint's;
//  - a holder that serves a corrupted segment (a fleet member built from the real parts,
//    pkg/peer/testing/corrupt_peer.h, in its own namespace): caught, disk, correct bytes;
//  - a daemon whose certificate another CA signed is refused by the holder, and loads from disk;
//  - a rank of several segments striped over two holders (each serves some).
// Needs root and iproute2 (CI has both); skipped with the reason otherwise.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <regex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "pkg/peer/testing/corrupt_peer.h"
#include "pkg/peer/testing/test_ca.h"
#include "pkg/safetensors/safetensors.h"
#include "tests/integration/daemon_harness.h"
#include "tests/testutil/temp_dir.h"

namespace weightcache {
namespace {

using testing::Process;
using testing::ProcIo;
using testing::StartedDaemon;

constexpr const char* kIp = "/usr/sbin/ip";
constexpr int kPeerPort = 7443;

// Runs `ip` (or `ip netns exec <ns> <cmd...>`) to its end; the error names the command.
absl::Status Ip(const std::vector<std::string>& args, const std::string& err_path) {
  std::vector<std::string> argv{kIp};
  argv.insert(argv.end(), args.begin(), args.end());
  auto run = testing::RunTool(argv, err_path);
  if (run.rc == 0) return absl::OkStatus();
  std::string cmd;
  for (const auto& a : argv) absl::StrAppend(&cmd, cmd.empty() ? "" : " ", a);
  return absl::InternalError(absl::StrCat(cmd, ": exit ", run.rc, ": ", run.out));
}

// Namespaces wcpf-<pid>-<i> (node i: eth0 10.77.0.<i+1>/24) and wcpf-<pid>-hub (a bridge
// joining the nodes' veth peers). Deleted on destruction (their veths go with them).
class NetnsFleet {
 public:
  NetnsFleet(std::string log) : log_(std::move(log)) {}
  ~NetnsFleet() {
    for (const auto& ns : made_) (void)Ip({"netns", "del", ns}, log_);
  }
  absl::Status Create(int nodes) {
    const std::string prefix = absl::StrCat("wcpf-", ::getpid(), "-");
    hub_ = prefix + "hub";
    if (auto s = Add(hub_); !s.ok()) return s;
    for (const auto& c :
         std::vector<std::vector<std::string>>{{"-n", hub_, "link", "add", "br0", "type", "bridge"},
                                               {"-n", hub_, "link", "set", "br0", "up"}}) {
      if (auto s = Ip(c, log_); !s.ok()) return s;
    }
    for (int i = 0; i < nodes; ++i) {
      const std::string ns = prefix + std::to_string(i);
      const std::string port = "p" + std::to_string(i);
      if (auto s = Add(ns); !s.ok()) return s;
      for (const auto& c : std::vector<std::vector<std::string>>{
               {"link", "add", "eth0", "netns", ns, "type", "veth", "peer", "name", port, "netns",
                hub_},
               {"-n", hub_, "link", "set", port, "master", "br0"},
               {"-n", hub_, "link", "set", port, "up"},
               {"-n", ns, "addr", "add", Address(i) + "/24", "dev", "eth0"},
               {"-n", ns, "link", "set", "eth0", "up"},
               {"-n", ns, "link", "set", "lo", "up"}}) {
        if (auto s = Ip(c, log_); !s.ok()) return s;
      }
      nodes_.push_back(ns);
    }
    for (const auto& ns : nodes_) {
      if (auto s = WaitForCarrier(ns); !s.ok()) return s;
    }
    return absl::OkStatus();
  }
  const std::string& ns(int i) const { return nodes_.at(i); }
  static std::string Address(int i) { return "10.77.0." + std::to_string(i + 1); }
  // Node i's sending rate limited (tc tbf on its eth0): a pull from it takes seconds.
  absl::Status Throttle(int i, const std::string& rate) {
    return Ip({"netns", "exec", ns(i), "tc", "qdisc", "add", "dev", "eth0", "root", "tbf", "rate",
               rate, "burst", "64kb", "latency", "500ms"},
              log_);
  }

 private:
  // `link set up` returns before a veth has its carrier, and UCX lists only running interfaces
  // when a daemon starts: one started too early has tcp/lo alone and cannot reach its peers
  // (bench/peer_fill_netns.sh failed so in one run of four). Bounded: 5 s is a failure.
  absl::Status WaitForCarrier(const std::string& ns) {
    const std::vector<std::string> argv{kIp, "-n", ns, "-o", "link", "show", "eth0"};
    std::string last;
    for (int i = 0; i < 100; ++i) {
      last = testing::RunTool(argv, log_).out;
      if (last.find("LOWER_UP") != std::string::npos) return absl::OkStatus();
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return absl::DeadlineExceededError(
        absl::StrCat("eth0 in ", ns, " has no carrier after 5 s: ", last));
  }
  absl::Status Add(const std::string& ns) {
    auto s = Ip({"netns", "add", ns}, log_);
    if (s.ok()) made_.push_back(ns);
    return s;
  }
  const std::string log_;
  std::string hub_;
  std::vector<std::string> nodes_, made_;
};

// The first byte-level difference between `lease`'s tensors and the checkpoint in `dir`
// (tp 1, stored dtypes: each tensor is its bytes in the file); "" when every tensor is equal.
std::string DiffFromCheckpoint(const client::Lease& lease, const std::string& dir) {
  auto ck = safetensors::Checkpoint::Open(dir);
  if (!ck.ok()) return std::string(ck.status().message());
  if (lease.tensors().size() != ck->tensors().size()) {
    return absl::StrCat(lease.tensors().size(), " tensors mapped, ", ck->tensors().size(),
                        " in the checkpoint");
  }
  for (const auto& v : lease.tensors()) {
    const auto* t = ck->Find(v.name);
    if (t == nullptr) return "no " + v.name + " in the checkpoint";
    if (t->nbytes != v.nbytes) return v.name + ": sizes differ";
    std::vector<char> want(t->nbytes);
    const int fd = ck->files().at(t->file_index).fd();
    const ssize_t got = ::pread(fd, want.data(), want.size(), static_cast<off_t>(t->file_offset));
    if (got != static_cast<ssize_t>(want.size())) return v.name + ": short read";
    if (std::memcmp(want.data(), v.data, want.size()) != 0) return v.name + ": bytes differ";
  }
  return "";
}

class PeerFillNetnsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "needs root: network namespaces and veth pairs";
    if (::access(kIp, X_OK) != 0) GTEST_SKIP() << "needs " << kIp << " (iproute2)";
    fleet_ = std::make_unique<NetnsFleet>(dir_ / "ip.log");
    if (auto s = fleet_->Create(4); !s.ok()) {
      // A container without CAP_SYS_ADMIN / CAP_NET_ADMIN: no namespaces to make.
      GTEST_SKIP() << "cannot make network namespaces here: " << s;
    }
    shape_ = testing::SmallLlama();
    shape_.hidden = 512;
    shape_.intermediate = 2048;
    shape_.vocab = 4096;  // ~ 30 MB: a disk read would show in rchar
    ASSERT_TRUE(safetensors::WriteLlamaCheckpoint(dir_ / "m", shape_).ok());
    for (const auto& e : std::filesystem::directory_iterator(dir_ / "m")) {
      model_bytes_ += std::filesystem::file_size(e.path());
    }
    auto ca = peer::testing::TestCa::Create(dir_.path(), "fleet");
    ASSERT_TRUE(ca.ok()) << ca.status();
    auto leaf = ca->Issue("daemon", peer::kDefaultServerName);
    ASSERT_TRUE(leaf.ok()) << leaf.status();
    fleet_files_ = {leaf->cert_file, leaf->key_file, ca->ca_file()};
  }

  // Daemon `name` in node `node`'s namespace: the peer API on its address, asking `peers`
  // (node indices); `extra` flags appended.
  std::unique_ptr<StartedDaemon> StartIn(int node, const std::string& name,
                                         const std::vector<int>& peers,
                                         const std::vector<std::string>& extra = {},
                                         const peer::TlsFiles* files = nullptr) {
    const peer::TlsFiles& f = files != nullptr ? *files : fleet_files_;
    std::vector<std::string> argv{
        kIp, "netns", "exec", fleet_->ns(node), "/usr/bin/env", "UCX_TLS=tcp", WEIGHTCACHED_PATH,
        "--socket_dir=" + dir_ / name, "--backend=host", "--metrics_address=off",
        "--model=name=m,model_dir=" + dir_ / "m",
        "--digest_store=" + dir_ / (name + "-digests.json"),
        absl::StrCat("--peer_listen=", NetnsFleet::Address(node), ":", kPeerPort),
        "--peer_tls_cert_file=" + f.cert_file, "--peer_tls_key_file=" + f.key_file,
        "--peer_tls_ca_file=" + f.ca_file,
        // Processes on one host, with no API server: identities are certificate names even
        // where the runner is a pod with in-cluster credentials (--peer_identity=auto).
        "--peer_identity=certificate"};
    std::string list;
    for (int p : peers) {
      absl::StrAppend(&list, list.empty() ? "" : ",", NetnsFleet::Address(p), ":", kPeerPort);
    }
    if (!list.empty()) argv.push_back("--peers=" + list);
    // Every node here holds one certificate (one identity): a quorum of distinct names is
    // impossible, so these daemons believe a single holder (issue 48; the anchors are
    // peer_fill_test's).
    if (!list.empty()) argv.push_back("--peer_trust=single");
    argv.insert(argv.end(), extra.begin(), extra.end());
    auto d = testing::StartDaemon(argv, dir_ / name, Log(name), {}, std::chrono::seconds(60));
    EXPECT_TRUE(d.ok()) << d.status();
    if (!d.ok()) return nullptr;
    return std::make_unique<StartedDaemon>(std::move(d).value());
  }
  std::string Log(const std::string& name) const { return dir_ / (name + ".log"); }
  // A holder: started, "m" loaded from disk and ready.
  std::unique_ptr<StartedDaemon> StartHolder(int node, const std::string& name,
                                             const std::vector<std::string>& extra = {}) {
    auto d = StartIn(node, name, {}, extra);
    if (d == nullptr) return nullptr;
    auto lease = Acquire(*d);
    EXPECT_TRUE(lease.ok()) << lease.status();
    EXPECT_TRUE(testing::WaitForLogLine(Log(name), "from disk)"));
    return d;
  }
  absl::StatusOr<std::unique_ptr<client::Lease>> Acquire(StartedDaemon& d) {
    client::AcquireOptions o;
    o.model = "m";
    o.wait_ready = true;
    o.load_on_miss = true;
    o.timeout = std::chrono::seconds(120);
    return d.client->Acquire(o);
  }
  // The entry of "m"; with `must`, its absence is a failure.
  v1::EntryInfo EntryOf(StartedDaemon& d, bool must = true) {
    auto st = d.client->Status();
    EXPECT_TRUE(st.ok()) << st.status();
    if (st.ok()) {
      for (const auto& e : st->entries()) {
        if (e.model() == "m") return e;
      }
    }
    if (must) ADD_FAILURE() << "no entry of m";
    return {};
  }
  // The holder's digest store, copied for `name` (a node that knows the checkpoint's content
  // digests without hashing it: docs/peer-fill.md, "Identity without reading").
  void ShareDigests(const std::string& from, const std::string& name) {
    // With its HMAC key: the store authenticates its entries (pkg/identity/identity.h).
    for (const std::string suffix : {"-digests.json", "-digests.json.key"}) {
      std::filesystem::copy_file(dir_ / (from + suffix), dir_ / (name + suffix),
                                 std::filesystem::copy_options::overwrite_existing);
    }
  }

  weightcache::testing::TempDir dir_;
  std::unique_ptr<NetnsFleet> fleet_;
  safetensors::LlamaShape shape_;
  uint64_t model_bytes_ = 0;
  peer::TlsFiles fleet_files_;
};

TEST_F(PeerFillNetnsTest, AColdNodeFillsFromAHolderWithoutReadingTheCheckpoint) {
  auto a = StartHolder(0, "a");
  ASSERT_NE(a, nullptr);
  ShareDigests("a", "b");
  auto b = StartIn(1, "b", {0});
  ASSERT_NE(b, nullptr);
  auto lease = Acquire(*b);
  ASSERT_TRUE(lease.ok()) << lease.status();
  EXPECT_EQ(DiffFromCheckpoint(**lease, dir_ / "m"), "");
  const v1::EntryInfo e = EntryOf(*b);
  EXPECT_EQ(e.source(), "peer_fill");
  EXPECT_EQ(e.bytes_read(), 0u);
  const uint64_t rchar = ProcIo(b->process->pid(), "rchar");
  EXPECT_LT(rchar, model_bytes_ / 8) << "the filling daemon read " << rchar << " bytes";
  std::printf("filled over veth: rchar %llu bytes (checkpoint %llu bytes)\n",
              static_cast<unsigned long long>(rchar),
              static_cast<unsigned long long>(model_bytes_));
  EXPECT_TRUE(testing::WaitForLogLine(Log("b"), "peer fill of m: "));
}

TEST_F(PeerFillNetnsTest, AHolderKilledMidTransferLeavesADiskLoadWithTheCheckpointsBytes) {
  auto a = StartHolder(0, "a");
  ASSERT_NE(a, nullptr);
  // ~30 MB at 40 Mbit/s: about six seconds of pulling.
  ASSERT_TRUE(fleet_->Throttle(0, "40mbit").ok());
  ShareDigests("a", "b");
  auto b = StartIn(1, "b", {0});
  ASSERT_NE(b, nullptr);
  // An engine's Acquire starts the fill and waits for it (on a connection of its own).
  auto engine = client::Client::Connect(dir_ / "b");
  ASSERT_TRUE(engine.ok()) << engine.status();
  std::thread waiting([&] {
    client::AcquireOptions o;
    o.model = "m";
    o.wait_ready = true;
    o.load_on_miss = true;
    o.timeout = std::chrono::seconds(120);
    auto lease = (*engine)->Acquire(o);
    EXPECT_TRUE(lease.ok()) << lease.status();  // the fallback's bytes, after the kill
  });
  // Until the fill has moved some bytes but not all of them.
  v1::EntryInfo e;
  for (const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
       std::chrono::steady_clock::now() < until;) {
    e = EntryOf(*b, /*must=*/false);  // none while the peers are surveyed
    if (e.source() == "peer_fill" && e.bytes_done() > 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (e.bytes_done() == 0) {
    a->process->Kill(SIGKILL);
    waiting.join();
    FAIL() << "the fill moved no byte in 60 s";
  }
  // (Whether the kill came before the pull's end, the fallback below tells: a finished fill
  // would not fall back.)
  a->process->Kill(SIGKILL);
  a->process->Wait();
  waiting.join();
  auto lease = Acquire(*b);
  ASSERT_TRUE(lease.ok()) << lease.status();
  EXPECT_EQ(DiffFromCheckpoint(**lease, dir_ / "m"), "");
  e = EntryOf(*b);
  EXPECT_GT(e.bytes_read(), 0u);  // read from disk after the source died
  EXPECT_TRUE(testing::WaitForLogLine(Log("b"), "fell back to disk (transfer)") ||
              testing::WaitForLogLine(Log("b"), "fell back to disk (timeout)"))
      << testing::ReadFileOrEmpty(Log("b"));
}

TEST_F(PeerFillNetnsTest, AHolderServingACorruptedSegmentIsCaught) {
  auto a = StartHolder(0, "a");
  ASSERT_NE(a, nullptr);
  auto fp = Acquire(*a);
  ASSERT_TRUE(fp.ok()) << fp.status();
  // The corrupt member, in node 2's namespace: it copies A's segments over the network, flips
  // a byte of segment 0, and describes the model with A's record.
  Process bad({kIp, "netns", "exec", fleet_->ns(2), "/usr/bin/env", "UCX_TLS=tcp",
               CORRUPT_PEER_PATH, absl::StrCat(NetnsFleet::Address(2), ":", kPeerPort),
               fleet_files_.cert_file, fleet_files_.key_file, fleet_files_.ca_file,
               absl::StrCat(NetnsFleet::Address(0), ":", kPeerPort), (*fp)->fingerprint(), "0"},
              Log("corrupt"));
  ASSERT_TRUE(bad.WaitFor("ready ", std::chrono::seconds(60)).has_value())
      << testing::ReadFileOrEmpty(Log("corrupt"));
  ShareDigests("a", "b");
  auto b = StartIn(1, "b", {2});  // knows only the corrupt member
  ASSERT_NE(b, nullptr);
  auto lease = Acquire(*b);
  ASSERT_TRUE(lease.ok()) << lease.status();
  EXPECT_EQ(DiffFromCheckpoint(**lease, dir_ / "m"), "");
  EXPECT_GT(EntryOf(*b).bytes_read(), 0u);
  EXPECT_TRUE(testing::WaitForLogLine(Log("b"), "fell back to disk (digest)"))
      << testing::ReadFileOrEmpty(Log("b"));
  EXPECT_TRUE(testing::WaitForLogLine(Log("b"), "differs from the digest in its own record"));
}

TEST_F(PeerFillNetnsTest, ADaemonWhoseCertificateAnotherCaSignedIsRefused) {
  auto a = StartHolder(0, "a");
  ASSERT_NE(a, nullptr);
  auto other = peer::testing::TestCa::Create(dir_.path(), "other");
  ASSERT_TRUE(other.ok());
  auto leaf = other->Issue("intruder", peer::kDefaultServerName);
  ASSERT_TRUE(leaf.ok());
  const peer::TlsFiles intruder{leaf->cert_file, leaf->key_file, other->ca_file()};
  ShareDigests("a", "c");
  auto c = StartIn(2, "c", {0}, {}, &intruder);
  ASSERT_NE(c, nullptr);
  auto lease = Acquire(*c);
  ASSERT_TRUE(lease.ok()) << lease.status();
  EXPECT_EQ(DiffFromCheckpoint(**lease, dir_ / "m"), "");
  EXPECT_EQ(EntryOf(*c).source(), "disk");  // nothing from the holder
  EXPECT_TRUE(testing::WaitForLogLine(Log("c"), "not asked about"))
      << testing::ReadFileOrEmpty(Log("c"));
}

TEST_F(PeerFillNetnsTest, ARankOfSeveralSegmentsIsStripedOverTwoHolders) {
  const std::vector<std::string> small{"--host_max_segment_bytes=4MiB"};
  auto a = StartHolder(0, "a", small);
  auto c = StartHolder(2, "c", small);
  ASSERT_TRUE(a != nullptr && c != nullptr);
  ShareDigests("a", "b");
  auto b = StartIn(1, "b", {0, 2}, small);
  ASSERT_NE(b, nullptr);
  auto lease = Acquire(*b);
  ASSERT_TRUE(lease.ok()) << lease.status();
  EXPECT_EQ(DiffFromCheckpoint(**lease, dir_ / "m"), "");
  ASSERT_GT((*lease)->segment_count(), 3u);
  EXPECT_EQ(EntryOf(*b).source(), "peer_fill");
  // "... from 10.77.0.1:7443 (host): 5 segments, 10.77.0.3:7443 (host): 3 segments in ..."
  ASSERT_TRUE(testing::WaitForLogLine(Log("b"), " segments in "));
  const std::string log = testing::ReadFileOrEmpty(Log("b"));
  for (int node : {0, 2}) {
    std::smatch m;
    const std::regex re(NetnsFleet::Address(node) + ":7443 \\([^)]*\\): ([0-9]+) segments");
    ASSERT_TRUE(std::regex_search(log, m, re)) << log;
    EXPECT_GT(std::stoi(m[1]), 0) << "node " << node << " served nothing: " << log;
  }
}

}  // namespace
}  // namespace weightcache
