// Multi-process tests on the host backend: a real weightcached process, real client
// processes, real descriptors. Every wait is bounded; nothing sleeps to synchronise.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "pkg/client/client.h"
#include "pkg/safetensors/writer.h"
#include "pkg/util/unix_socket.h"
#include "tests/integration/daemon_harness.h"
#include "tests/integration/process.h"
#include "tests/testutil/temp_dir.h"
#include "weightcache/v1/weightcache.pb.h"

namespace weightcache {
namespace {

using namespace std::chrono_literals;
using testing::Process;
using testing::TempDir;

safetensors::LlamaShape Small() { return testing::SmallLlama(); }

class DaemonTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(safetensors::WriteLlamaCheckpoint(dir_ / "tiny", Small()).ok());
    socket_dir_ = dir_ / "s";
  }

  // Starts the daemon with `extra` flags and waits (bounded) until it answers Status.
  void StartDaemon(const std::vector<std::string>& extra) {
    std::vector<std::string> argv{WEIGHTCACHED_PATH, "--socket_dir=" + socket_dir_,
                                  "--backend=host", "--metrics_address=off"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    auto d = testing::StartDaemon(argv, socket_dir_, log_path());
    ASSERT_TRUE(d.ok()) << d.status();
    daemon_ = std::move(d->process);
    client_ = std::move(d->client);
  }

  std::string log_path() const { return dir_ / "daemon.log"; }
  std::string Log() const { return testing::ReadFileOrEmpty(log_path()); }

  v1::StatusResponse WaitStatus(const std::function<bool(const v1::StatusResponse&)>& pred,
                                std::chrono::milliseconds timeout) {
    return testing::WaitForStatus(*client_, pred, timeout);
  }

  static int Leases(const v1::StatusResponse& st, const std::string& model) {
    int n = 0;
    for (const auto& e : st.entries()) {
      if (e.model() == model) n += static_cast<int>(e.lease_count());  // every process's
    }
    return n;
  }

  std::unique_ptr<Process> StartClient(const std::string& model) {
    return std::make_unique<Process>(std::vector<std::string>{TEST_CLIENT_PATH, socket_dir_, model},
                                     dir_ / "client.log");
  }

  TempDir dir_;
  std::string socket_dir_;
  std::unique_ptr<Process> daemon_;
  std::unique_ptr<client::Client> client_;
};

TEST_F(DaemonTest, SocketDirAndFilesHaveRestrictiveModes) {
  StartDaemon({"--model=name=tiny,model_dir=" + dir_ / "tiny"});
  struct stat st;
  ASSERT_EQ(::stat(socket_dir_.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0750u);
  ASSERT_EQ(::stat((socket_dir_ + "/control.sock").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0007, 0u);
  ASSERT_EQ(::stat((socket_dir_ + "/handle.sock").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0007, 0u);
}

TEST_F(DaemonTest, SocketGidGivesTheSocketsToTheEnginesGroup) {
  gid_t other = ::getegid() == 0 ? 65534 : ::getegid();  // root may chown to any group
  StartDaemon(
      {"--model=name=tiny,model_dir=" + dir_ / "tiny", "--socket_gid=" + std::to_string(other)});
  for (const char* p : {"", "/control.sock", "/handle.sock"}) {
    struct stat st;
    ASSERT_EQ(::stat((socket_dir_ + p).c_str(), &st), 0) << p;
    EXPECT_EQ(st.st_gid, other) << p;
  }
}

TEST_F(DaemonTest, TwoClientProcessesMapTheSamePagesReadOnlyWithExactBytes) {
  StartDaemon({"--model=name=tiny,model_dir=" + dir_ / "tiny"});
  auto a = StartClient("tiny");
  auto b = StartClient("tiny");
  std::vector<std::string> inode;
  for (auto* c : {a.get(), b.get()}) {
    auto line = c->WaitFor("INODE", 20s);
    ASSERT_TRUE(line) << "client log in " << dir_.path();
    inode.push_back(*line);
    EXPECT_EQ(c->WaitFor("BYTES", 20s).value_or(""), "BYTES OK");
    EXPECT_EQ(c->WaitFor("WRITE", 20s).value_or(""), "WRITE REFUSED");
    ASSERT_TRUE(c->WaitFor("READY", 20s));
  }
  // Same memfd inode: the same physical pages, not copies; and mapped read-only.
  EXPECT_EQ(inode[0], inode[1]);
  EXPECT_NE(inode[0].find(" r--s"), std::string::npos) << inode[0];
  auto st = WaitStatus([](const auto& s) { return Leases(s, "tiny") == 2; }, 5s);
  EXPECT_EQ(Leases(st, "tiny"), 2);
  // A clean exit ends the lease too.
  a->CloseStdin();
  a->Wait();
  WaitStatus([](const auto& s) { return Leases(s, "tiny") == 1; }, 5s);
}

TEST_F(DaemonTest, SigkilledClientLosesItsLeaseWithinASecond) {
  StartDaemon({"--model=name=tiny,model_dir=" + dir_ / "tiny"});
  auto c = StartClient("tiny");
  ASSERT_TRUE(c->WaitFor("READY", 20s));
  WaitStatus([](const auto& s) { return Leases(s, "tiny") == 1; }, 5s);
  auto t0 = std::chrono::steady_clock::now();
  c->Kill(SIGKILL);
  c->Wait();
  auto st = WaitStatus([](const auto& s) { return Leases(s, "tiny") == 0; }, 1s);
  EXPECT_EQ(Leases(st, "tiny"), 0);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 1s);
}

TEST_F(DaemonTest, MappingSurvivesDaemonSigkill) {
  StartDaemon({"--model=name=tiny,model_dir=" + dir_ / "tiny"});
  client::AcquireOptions o;
  o.model = "tiny";
  o.wait_ready = true;
  auto lease = client_->Acquire(o);
  ASSERT_TRUE(lease.ok()) << lease.status();
  daemon_->Kill(SIGKILL);
  daemon_->Wait();
  auto ckpt = safetensors::Checkpoint::Open(dir_ / "tiny");
  ASSERT_TRUE(ckpt.ok());
  std::vector<char> buf;
  for (const auto& t : ckpt->tensors()) {
    const auto* v = (*lease)->Find(t.name);
    ASSERT_NE(v, nullptr) << t.name;
    buf.resize(t.nbytes);
    ASSERT_EQ(::pread(ckpt->files()[t.file_index].fd(), buf.data(), t.nbytes,
                      static_cast<off_t>(t.file_offset)),
              static_cast<ssize_t>(t.nbytes));
    ASSERT_EQ(std::memcmp(v->data, buf.data(), t.nbytes), 0) << t.name;
  }
}

TEST_F(DaemonTest, ThirtyTwoConcurrentAcquiresDuringALoadCauseOneLoad) {
  StartDaemon({"--model=name=tiny,model_dir=" + dir_ / "tiny", "--preload=false"});
  std::atomic<int> ok{0};
  std::vector<std::string> errors(32);
  std::vector<std::thread> threads;
  for (int i = 0; i < 32; ++i) {
    threads.emplace_back([&, i] {
      client::AcquireOptions o;
      o.model = "tiny";
      o.load_on_miss = true;
      auto lease = client_->Acquire(o);
      if (lease.ok() && (*lease)->tensors().size() == 21) {
        ok++;
      } else {
        errors[i] = std::string(lease.status().message());
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok.load(), 32) << errors[0];
  auto st = client_->Status();
  ASSERT_TRUE(st.ok());
  ASSERT_EQ(st->entries_size(), 1);
  // Exactly one load ran: the daemon logs each finished load once.
  std::string log = Log();
  size_t loads = 0;
  for (size_t at = log.find("model tiny ready"); at != std::string::npos;
       at = log.find("model tiny ready", at + 1)) {
    loads++;
  }
  EXPECT_EQ(loads, 1u) << log;
  EXPECT_EQ(st->acquire_hits() + st->acquire_misses(), 32u);
}

TEST_F(DaemonTest, MismatchedRequestGetsTheFieldDiff) {
  StartDaemon({"--model=name=tiny,model_dir=" + dir_ / "tiny"});
  WaitStatus([](const auto& s) { return s.entries_size() == 1 && s.entries(0).state() == "ready"; },
             20s);
  client::AcquireOptions o;
  o.model = "tiny";
  o.tp_size = 2;
  o.tp_rank = 1;
  o.compute_capability = "sm_90";
  auto lease = client_->Acquire(o);
  ASSERT_EQ(lease.status().code(), absl::StatusCode::kFailedPrecondition) << lease.status();
  std::string msg(lease.status().message());
  EXPECT_NE(msg.find("tp_size: cached 1, asked 2"), std::string::npos) << msg;
  EXPECT_NE(msg.find("tp_rank: cached 0, asked 1"), std::string::npos) << msg;
  EXPECT_NE(msg.find("compute_capability: cached cpu, asked sm_90"), std::string::npos) << msg;
  auto st = client_->Status();
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->acquire_mismatches(), 1u);
}

TEST_F(DaemonTest, AcquireOnAnUnknownDeviceIsInvalidArgumentNamingItAndTheKnownOnes) {
  StartDaemon({"--model=name=tiny,model_dir=" + dir_ / "tiny", "--preload=false"});
  client::AcquireOptions o;
  o.model = "tiny";
  o.load_on_miss = true;
  o.device_uuid = "GPU-00000000-1111-2222-3333-444444444444";
  auto lease = client_->Acquire(o);
  ASSERT_EQ(lease.status().code(), absl::StatusCode::kInvalidArgument) << lease.status();
  std::string msg(lease.status().message());
  EXPECT_NE(msg.find("device GPU-00000000-1111-2222-3333-444444444444 is not a device of this "
                     "daemon's host backend (devices: host)"),
            std::string::npos)
      << msg;
  // Nothing was loaded for the bad request; the host "device" itself is served.
  auto st = client_->Status();
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->entries_size(), 0);
  o.device_uuid = "host";
  auto ok = client_->Acquire(o);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ((*ok)->device_uuid(), "host");
}

TEST_F(DaemonTest, UnknownModelIsAMissNamingTheKnownOnes) {
  StartDaemon({"--model=name=tiny,model_dir=" + dir_ / "tiny"});
  client::AcquireOptions o;
  o.model = "nope";
  auto lease = client_->Acquire(o);
  EXPECT_EQ(lease.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(lease.status().message().find("known: tiny"), absl::string_view::npos)
      << lease.status();
}

TEST_F(DaemonTest, TwoNamesOverOneCheckpointShareAnEntryAndEitherNameEvictsIt) {
  std::ofstream(dir_ / "specs.yaml") << "models:\n"
                                     << "  - name: tiny\n    model_dir: " << dir_ / "tiny"
                                     << "\n"
                                     << "  - name: alias\n    model_dir: " << dir_ / "tiny"
                                     << "\n";
  StartDaemon({"--spec_file=" + dir_ / "specs.yaml", "--preload=false"});
  client::AcquireOptions o;
  o.model = "tiny";
  o.load_on_miss = true;
  o.wait_ready = true;
  {
    auto first = client_->Acquire(o);
    ASSERT_TRUE(first.ok()) << first.status();
    o.model = "alias";
    auto second = client_->Acquire(o);  // the same fingerprint: served by tiny's entry
    ASSERT_TRUE(second.ok()) << second.status();
  }
  auto st =
      WaitStatus([](const auto& s) { return s.entries_size() == 1 && Leases(s, "tiny") == 0; }, 5s);
  EXPECT_EQ(st.entries(0).model(), "tiny");
  EXPECT_FALSE(st.has_staging());  // host backend: no pinned staging memory to report
  // Evicting by the second name drops the shared entry (it used to find nothing). Evict is
  // the operator's, on the admin socket.
  auto admin = testing::AdminClient(socket_dir_);
  ASSERT_TRUE(admin);
  auto n = admin->Evict("alias", "");
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, 1u);
  WaitStatus([](const auto& s) { return s.entries_size() == 0; }, 5s);
  // An unknown name is an error naming the known ones, not "nothing to evict".
  auto unknown = admin->Evict("nope", "");
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(unknown.status().message().find("known: alias, tiny"), absl::string_view::npos)
      << unknown.status();
}

// Issue 27: `weightcachectl verify --resident` asks the daemon to digest its resident copy
// now (nothing is mapped by the CLI): clean on the admin socket, refused on the engine socket.
TEST_F(DaemonTest, VerifyResidentRunsInTheDaemonForAnAdmin) {
  StartDaemon({"--model=name=tiny,model_dir=" + dir_ / "tiny"});
  WaitStatus([](const auto& s) { return s.entries_size() == 1 && s.entries(0).state() == "ready"; },
             30s);
  const std::string admin_socket = socket_dir_ + "-admin/control.sock";
  auto ok = testing::RunTool(
      {WEIGHTCACHECTL_PATH, "--socket=" + admin_socket, "verify", "--resident", "tiny"},
      dir_ / "ctl.err");
  EXPECT_EQ(ok.rc, 0) << ok.out << testing::ReadFileOrEmpty(dir_ / "ctl.err");
  EXPECT_THAT(ok.out, ::testing::HasSubstr("clean   tiny tp 0/1 on host: 1 segments"));
  EXPECT_THAT(ok.out, ::testing::HasSubstr("verify --resident OK: 1 entries match their digests"));
  auto refused = testing::RunTool(
      {WEIGHTCACHECTL_PATH, "--socket=" + socket_dir_, "verify", "--resident", "tiny"},
      dir_ / "ctl.err");
  EXPECT_NE(refused.rc, 0);
  EXPECT_THAT(testing::ReadFileOrEmpty(dir_ / "ctl.err"),
              ::testing::HasSubstr("may not verify resident weights"));
  // Status shows an admin how long ago the entry last matched its digests; an engine does
  // not learn it (issue 48).
  auto admin = testing::AdminClient(socket_dir_);
  ASSERT_TRUE(admin);
  auto st = admin->Status();
  ASSERT_TRUE(st.ok());
  ASSERT_EQ(st->entries_size(), 1);
  EXPECT_GE(st->entries(0).verified_seconds_ago(), 0);
  auto engine = client_->Status();
  ASSERT_TRUE(engine.ok());
  ASSERT_EQ(engine->entries_size(), 1);
  EXPECT_EQ(engine->entries(0).verified_seconds_ago(), -1);
}

TEST_F(DaemonTest, MalformedCheckpointFailsItsOwnLoadAndTheDaemonServesTheOther) {
  ASSERT_TRUE(safetensors::WriteLlamaCheckpoint(dir_ / "broken", Small()).ok());
  ::truncate((dir_ / "broken/model.safetensors").c_str(), 1000);
  std::ofstream(dir_ / "specs.yaml") << "models:\n"
                                     << "  - name: tiny\n    model_dir: " << dir_ / "tiny"
                                     << "\n"
                                     << "  - name: broken\n    model_dir: " << dir_ / "broken"
                                     << "\n";
  StartDaemon({"--spec_file=" + dir_ / "specs.yaml"});
  client::AcquireOptions o;
  o.model = "broken";
  o.wait_ready = true;
  auto bad = client_->Acquire(o);
  EXPECT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("model.safetensors"), absl::string_view::npos)
      << bad.status();
  o.model = "tiny";
  auto good = client_->Acquire(o);
  ASSERT_TRUE(good.ok()) << good.status();
  EXPECT_EQ((*good)->tensors().size(), 21u);
  EXPECT_EQ(::kill(daemon_->pid(), 0), 0);  // still alive
}

TEST_F(DaemonTest, RefusedQuantizationIsRejectedWithTheSupportedList) {
  ASSERT_TRUE(safetensors::WriteLlamaCheckpoint(dir_ / "awq", Small()).ok());
  std::ofstream(dir_ / "awq/config.json", std::ios::trunc)
      << R"({"architectures":["LlamaForCausalLM"],"quantization_config":{"quant_method":"awq","bits":4}})";
  StartDaemon({"--model=name=awq,model_dir=" + dir_ / "awq"});
  client::AcquireOptions o;
  o.model = "awq";
  auto lease = client_->Acquire(o);
  EXPECT_EQ(lease.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(lease.status().message().find("awq"), absl::string_view::npos);
  EXPECT_NE(lease.status().message().find("none, fp8_block"), absl::string_view::npos);
  auto st = client_->Status();
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->acquire_rejected(), 1u);
}

TEST_F(DaemonTest, BadTokenOnTheHandleChannelIsRefusedAndTheDaemonKeepsServing) {
  StartDaemon({"--model=name=tiny,model_dir=" + dir_ / "tiny"});
  {
    auto fd = ConnectUnix(socket_dir_ + "/handle.sock");
    ASSERT_TRUE(fd.ok());
    ASSERT_TRUE(WriteAll(fd->get(), "WCH1 0000\n").ok());
    auto line = ReadLine(fd->get(), 512);
    ASSERT_TRUE(line.ok());
    EXPECT_EQ(*line, "ERR PERMISSION_DENIED: unknown or expired token");
  }
  {
    auto fd = ConnectUnix(socket_dir_ + "/handle.sock");
    ASSERT_TRUE(fd.ok());
    ASSERT_TRUE(WriteAll(fd->get(), std::string(1000, 'x')).ok());
    auto line = ReadLine(fd->get(), 512);
    ASSERT_TRUE(line.ok());
    EXPECT_NE(line->find("ERR"), std::string::npos);
  }
  client::AcquireOptions o;
  o.model = "tiny";
  o.wait_ready = true;
  EXPECT_TRUE(client_->Acquire(o).ok());
}

TEST_F(DaemonTest, OversizedAndMalformedRequestsAreRefusedAndTheDaemonKeepsServing) {
  StartDaemon({"--model=name=tiny,model_dir=" + dir_ / "tiny"});
  client::AcquireOptions o;
  o.model = std::string(2 << 20, 'x');  // over the 1 MiB request bound
  auto big = client_->Acquire(o);
  EXPECT_EQ(big.status().code(), absl::StatusCode::kResourceExhausted) << big.status();
  client::AcquireOptions bad;
  bad.model = "tiny";
  bad.tp_size = 2;
  bad.tp_rank = 5;  // rank outside the layout
  auto r = client_->Acquire(bad);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("tp_rank 5 is not below tp_size 2"), absl::string_view::npos)
      << r.status();
  o.model = "tiny";
  o.wait_ready = true;
  EXPECT_TRUE(client_->Acquire(o).ok());
}

// Bytes of rows [r0, r1) and columns [c0, c1) of a row-major 2-D tensor in the checkpoint.
std::string Slice(const safetensors::Checkpoint& ckpt, const std::string& name, int64_t r0,
                  int64_t r1, int64_t c0, int64_t c1) {
  const auto* t = ckpt.Find(name);
  EXPECT_NE(t, nullptr) << name;
  if (t == nullptr) return "";
  size_t el = safetensors::DTypeSize(t->dtype);
  int64_t cols = t->shape.size() == 2 ? t->shape[1] : 1;
  std::string out;
  std::string row((c1 - c0) * el, '\0');
  for (int64_t r = r0; r < r1; ++r) {
    EXPECT_EQ(::pread(ckpt.files()[t->file_index].fd(), row.data(), row.size(),
                      static_cast<off_t>(t->file_offset + (r * cols + c0) * el)),
              static_cast<ssize_t>(row.size()));
    out += row;
  }
  return out;
}

std::string Bytes(const client::TensorView* v) {
  return v == nullptr ? "<missing>" : std::string(static_cast<const char*>(v->data), v->nbytes);
}

TEST_F(DaemonTest, TensorParallelRanksServeTheirShardsAndFusedViews) {
  std::ofstream(dir_ / "tp.yaml") << "name: tp\nmodel_dir: " << dir_ / "tiny"
                                  << "\ntp_size: 2\nlayout: sglang\n";
  StartDaemon({"--spec_file=" + dir_ / "tp.yaml"});
  auto ckpt = safetensors::Checkpoint::Open(dir_ / "tiny");
  ASSERT_TRUE(ckpt.ok());
  const auto s = Small();
  const int64_t head_dim = s.hidden / s.heads;
  for (int rank : {0, 1}) {
    client::AcquireOptions o;
    o.model = "tp";
    o.tp_size = 2;
    o.tp_rank = rank;
    o.wait_ready = true;
    auto lease = client_->Acquire(o);
    ASSERT_TRUE(lease.ok()) << lease.status();
    const auto& l = **lease;
    // Column-parallel: rows of the output dim.
    const auto* q = l.Find("model.layers.0.self_attn.q_proj.weight");
    ASSERT_NE(q, nullptr);
    EXPECT_EQ(q->shape, (std::vector<int64_t>{s.hidden / 2, s.hidden}));
    EXPECT_EQ(Bytes(q), Slice(*ckpt, "model.layers.0.self_attn.q_proj.weight", rank * s.hidden / 2,
                              (rank + 1) * s.hidden / 2, 0, s.hidden));
    // Row-parallel: columns of the input dim (a strided read).
    const auto* down = l.Find("model.layers.1.mlp.down_proj.weight");
    ASSERT_NE(down, nullptr);
    EXPECT_EQ(down->shape, (std::vector<int64_t>{s.hidden, s.intermediate / 2}));
    EXPECT_EQ(Bytes(down), Slice(*ckpt, "model.layers.1.mlp.down_proj.weight", 0, s.hidden,
                                 rank * s.intermediate / 2, (rank + 1) * s.intermediate / 2));
    // Fused views for the engine: q, k, v shards back to back.
    const auto* qkv = l.Find("model.layers.0.self_attn.qkv_proj.weight");
    ASSERT_NE(qkv, nullptr);
    const int64_t kv_rows = s.kv_heads * head_dim / 2;
    EXPECT_EQ(qkv->shape, (std::vector<int64_t>{s.hidden / 2 + 2 * kv_rows, s.hidden}));
    const auto* k = l.Find("model.layers.0.self_attn.k_proj.weight");
    ASSERT_NE(k, nullptr);
    EXPECT_EQ(Bytes(qkv),
              Bytes(q) + Bytes(k) + Bytes(l.Find("model.layers.0.self_attn.v_proj.weight")));
  }
  auto st = client_->Status();
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->entries_size(), 2);  // one entry per rank, both preloaded
  // The two ranks loaded together, reading each checkpoint byte once between them.
  uint64_t file_bytes = 0;
  for (const auto& t : ckpt->tensors()) file_bytes += t.nbytes;
  for (const auto& e : st->entries()) EXPECT_EQ(e.bytes_read(), file_bytes);
}

TEST_F(DaemonTest, CtlVerifyChecksEveryServedByteOfAShardAndCatchesADifference) {
  std::ofstream(dir_ / "tp.yaml") << "name: tp\nmodel_dir: " << dir_ / "tiny"
                                  << "\ntp_size: 2\nlayout: vllm\n";
  StartDaemon({"--spec_file=" + dir_ / "tp.yaml"});
  auto run = [&](const std::string& model_dir) {
    std::vector<std::string> argv{WEIGHTCACHECTL_PATH,
                                  "--socket=" + socket_dir_,
                                  "--tp_size=2",
                                  "--tp_rank=1",
                                  "verify",
                                  "tp"};
    if (!model_dir.empty()) argv.insert(argv.begin() + 1, "--model_dir=" + model_dir);
    Process ctl(argv, dir_ / "ctl.log");
    std::string out, line;
    while (auto l = ctl.ReadLine(20s)) out += *l + "\n";
    int status = ctl.Wait();
    return std::make_pair(WIFEXITED(status) ? WEXITSTATUS(status) : -1, out);
  };
  auto [ok_rc, ok_out] = run("");
  EXPECT_EQ(ok_rc, 0) << ok_out;
  EXPECT_NE(ok_out.find("verify OK"), std::string::npos) << ok_out;
  // A copy of the checkpoint with one byte of one rank-1 row changed: verify must see it.
  std::filesystem::copy(dir_ / "tiny", dir_ / "changed");
  auto ckpt = safetensors::Checkpoint::Open(dir_ / "changed");
  ASSERT_TRUE(ckpt.ok());
  const auto* t = ckpt->Find("model.layers.0.mlp.down_proj.weight");  // row-parallel
  ASSERT_NE(t, nullptr);
  const int64_t cols = t->shape[1];
  uint64_t at = t->file_offset + (cols - 1) * 2;  // last column: rank 1's half
  int fd = ::open((dir_ / "changed/" + ckpt->files()[t->file_index].info().name).c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  char b = 0;
  ASSERT_EQ(::pread(fd, &b, 1, static_cast<off_t>(at)), 1);
  b = static_cast<char>(b ^ 0x5a);
  ASSERT_EQ(::pwrite(fd, &b, 1, static_cast<off_t>(at)), 1);
  ::close(fd);
  auto [bad_rc, bad_out] = run(dir_ / "changed");
  EXPECT_EQ(bad_rc, 1) << bad_out;
  EXPECT_NE(bad_out.find("DIFFERENT model.layers.0.mlp.down_proj.weight"), std::string::npos)
      << bad_out;
}

TEST_F(DaemonTest, SecondDaemonOnTheSameSocketDirIsRefused) {
  StartDaemon({"--model=name=tiny,model_dir=" + dir_ / "tiny"});
  Process second(
      {WEIGHTCACHED_PATH, "--socket_dir=" + socket_dir_, "--backend=host", "--metrics_address=off"},
      dir_ / "second.log");
  int status = second.Wait();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) != 0);
  std::ifstream in(dir_ / "second.log");
  std::stringstream ss;
  ss << in.rdbuf();
  EXPECT_NE(ss.str().find("another daemon listens on " + socket_dir_ + "/control.sock"),
            std::string::npos)
      << ss.str();
  EXPECT_TRUE(client_->Status().ok());  // the first one still serves
}

// Issue 26: -7 as a gid, 0 read threads and a device named twice were accepted (bent into
// something else), and a second --model silently replaced the first.
TEST_F(DaemonTest, BadFlagsStopTheDaemonNamingTheFlag) {
  for (const std::string flag : {
           "--staging_keep=lots",
           "--memory_budget=12XB",
           "--memory_budget=0%",
           "--socket_gid=-7",
           "--read_threads=0",
           "--host_devices=a,a",
           "--device_plugin_slots=0",
           "--keeper_timeout=0",
           "--scrub_interval=0.01",
           "--scrub_bandwidth=fast",
           "--peer_listen=127.0.0.1:0 --peer_tls_key_file=/nonexistent/tls.key",
           "--peer_transfer_hold_seconds=0",
           "--peers=node-a:7443,,node-b:7443",
           "--peers=node-a",
           "--peers=node-a:7443 --peer_tls_ca_file=/nonexistent/ca.crt",
           "--peer_describe_timeout_ms=0",
           "--peer_identity=tokens",
           "--node_name=Node_A --peer_identity=token --peers=node-a:7443",
           "--peer_max_connections=0",
           "--peer_max_connections_per_address=-1",
           "--peer_handshake_timeout_ms=0",
           "--peer_pull_timeout_seconds=-1",
           "--host_max_segment_bytes=12",
           "--host_max_segment_bytes=lots",
           "--model=name=a,model_dir=/x --model=name=b,model_dir=/y",
           // Issue 60: accepted, then found out at the first load or put (or never).
           "--model_roots=/nonexistent",
           "--model_roots=models",
           "--keeper_socket=keeper.sock",
           "--container_socket_dir=run/weightcache",
           "--artifact_dir=artifacts",
           "--pod_resources_cache=-1",
           "--artifact_max_bytes=0",
           "--artifact_max_bytes=2GiB",
           "--max_connections=10",
           "--artifact_max_puts_per_unit=9",
           "--artifact_max_puts=0",
           "--artifact_reserve_per_unit=600MiB",
       }) {
    std::vector<std::string> argv{WEIGHTCACHED_PATH, "--socket_dir=" + socket_dir_,
                                  "--backend=host", "--metrics_address=off"};
    for (const auto& part : absl::StrSplit(flag, ' ')) argv.emplace_back(part);
    Process p(argv, dir_ / "bad.log");
    int status = p.Wait();
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 2) << flag;
    const std::string log = testing::ReadFileOrEmpty(dir_ / "bad.log");
    EXPECT_NE(log.find(flag.substr(0, flag.find('='))), std::string::npos) << log;
  }
}

// The real binary, one mistyped flag: exit status 2 before anything is served, and the one
// line on stderr names the flag, the value and why.
TEST_F(DaemonTest, AModelRootThatDoesNotExistStopsTheDaemonAtStart) {
  const std::string missing = dir_ / "no-such-models";
  Process p({WEIGHTCACHED_PATH, "--socket_dir=" + socket_dir_, "--backend=host",
             "--metrics_address=off", "--model_roots=" + missing},
            dir_ / "roots.log");
  const int status = p.Wait();
  ASSERT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 2);
  // (The open-file limit's info line may come first.)
  EXPECT_THAT(testing::ReadFileOrEmpty(dir_ / "roots.log"),
              ::testing::EndsWith("weightcached: INVALID_ARGUMENT: --model_roots=" + missing +
                                  ": No such file or directory; every model_dir must resolve "
                                  "under an existing directory, so no model under this root "
                                  "could load\n"));
  EXPECT_FALSE(std::filesystem::exists(socket_dir_ + "/control.sock"));
}

}  // namespace
}  // namespace weightcache
