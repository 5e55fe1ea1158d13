// Compile artifacts through the daemon (issue 29): put and get over the real sockets, the
// roles that guard them, single flight, an abandoned put, eviction, and the directory that
// keeps them across a restart.
#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstring>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "pkg/metrics/metrics.h"
#include "pkg/server/testing/in_process_daemon.h"
#include "pkg/server/testing/metric_sample.h"
#include "pkg/util/unix_socket.h"
#include "prometheus/registry.h"
#include "weightcache/v1/weightcache.grpc.pb.h"

namespace weightcache::server {
namespace {

using testing::DaemonInProcessTest;
using ::testing::HasSubstr;

v1::ArtifactKey Key(const std::string& kind = "torch-compile") {
  v1::ArtifactKey k;
  k.set_kind(kind);
  k.set_model("m");
  k.set_fingerprint("wc1-test");
  k.set_torch_version("2.11.0");
  k.set_compute_capability("9.0");
  k.set_settings_hash("mode=default");
  return k;
}

// Bytes that differ at every position (a shifted or truncated copy would not compare equal).
std::string Pattern(size_t n) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>((i * 131 + i / 4099) & 0xff);
  return s;
}

class ArtifactsTest : public DaemonInProcessTest {
 protected:
  std::unique_ptr<v1::WeightCache::Stub> Stub() {
    return v1::WeightCache::NewStub(
        grpc::CreateChannel("unix:" + dir_ / "s/control.sock", grpc::InsecureChannelCredentials()));
  }
  // The value of metric `name` whose labels include `labels` (-1 when there is none).
  double Sample(const std::string& name, const std::map<std::string, std::string>& labels = {}) {
    return testing::Sample(registry_, name, labels);
  }
  // Polls Status until `n` puts are in flight (begun by the daemon) or 30 s passed; the last
  // count seen.
  uint64_t WaitForPutsInFlight(uint64_t n) {
    uint64_t seen = 0;
    for (const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
         std::chrono::steady_clock::now() < until;) {
      auto st = client_->Status();
      if (st.ok()) seen = st->artifact_usage().puts_in_flight();
      if (seen == n) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));  // polling with a deadline
    }
    return seen;
  }
  // The daemon uses the metrics: it goes before they do.
  void TearDown() override {
    client_.reset();
    daemon_.reset();
  }

  prometheus::Registry registry_;
  metrics::Metrics metrics_{registry_, metrics::BuildInfo{"t", "none", "host"}};
};

TEST_F(ArtifactsTest, APutArtifactIsMappedReadOnlyByTheNextEngine) {
  Start({});
  const std::string blob = Pattern((3 << 20) + 17);  // several 1 MiB messages
  auto put = client_->PutArtifact(Key(), blob);
  ASSERT_TRUE(put.ok()) << put.status();
  EXPECT_EQ(put->bytes(), blob.size());
  EXPECT_EQ(put->sha256().size(), 64u);

  auto other = client::Client::Connect(dir_ / "s");
  ASSERT_TRUE(other.ok());
  auto got = (*other)->GetArtifact(Key());
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ((*got)->size(), blob.size());
  EXPECT_EQ(std::memcmp((*got)->data(), blob.data(), blob.size()), 0);
  EXPECT_EQ((*got)->id(), put->id());
  // Sealed: no engine can map it writable, so no engine can change what the next one runs.
  EXPECT_EQ(::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, (*got)->fd(), 0), MAP_FAILED);
  // Another key (other compile settings) is another artifact.
  auto k = Key();
  k.set_settings_hash("mode=max-autotune");
  EXPECT_EQ(client_->GetArtifact(k).status().code(), absl::StatusCode::kNotFound);

  auto st = client_->Status();
  ASSERT_TRUE(st.ok());
  ASSERT_EQ(st->artifacts_size(), 1);
  const auto& a = st->artifacts(0);
  EXPECT_EQ(a.id(), put->id());
  EXPECT_EQ(a.key().kind(), "torch-compile");
  EXPECT_EQ(a.bytes(), blob.size());
  EXPECT_EQ(a.publisher().uid(), static_cast<int32_t>(::geteuid()));
  EXPECT_EQ(a.publisher().pid(), static_cast<int32_t>(::getpid()));
  EXPECT_TRUE(a.resident());
  EXPECT_EQ(st->artifact_usage().resident_bytes(), blob.size());
  // Putting the same key again changes nothing.
  EXPECT_EQ(client_->PutArtifact(Key(), "other bytes").status().code(),
            absl::StatusCode::kAlreadyExists);
}

TEST_F(ArtifactsTest, PuttingNeedsThePublishRoleGettingTheModelsMapRule) {
  DaemonOptions o;
  o.admin_uids = {::geteuid() + 4242};  // not this process: an engine
  o.publish_uids = {::geteuid() + 4242};
  Start(std::move(o));
  auto put = client_->PutArtifact(Key(), "kernels");
  EXPECT_EQ(put.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(put.status().message()), HasSubstr("--publish_uids"));
  // Getting is what any engine of the model may do: here, a plain miss.
  EXPECT_EQ(client_->GetArtifact(Key()).status().code(), absl::StatusCode::kNotFound);
  // Evicting is an admin's.
  EXPECT_EQ(client_->EvictArtifacts("", "m").status().code(), absl::StatusCode::kPermissionDenied);
  // A model the daemon does not know: named.
  auto k = Key();
  k.set_model("nope");
  auto got = client_->GetArtifact(k);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(got.status().message()), HasSubstr("model 'nope'"));
}

TEST_F(ArtifactsTest, BadKeysAndSizesAreRefusedNamingTheField) {
  Start({});
  auto k = Key();
  k.set_fingerprint("");
  auto put = client_->PutArtifact(k, "x");
  EXPECT_EQ(put.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(put.status().message()), HasSubstr("'fingerprint' is required"));
  // Declared size and sent bytes differ: refused, nothing stored.
  auto stub = Stub();
  grpc::ClientContext ctx;
  v1::PutArtifactResponse resp;
  auto w = stub->PutArtifact(&ctx, &resp);
  v1::PutArtifactRequest m;
  *m.mutable_key() = Key();
  m.set_size(10);
  m.set_data("12345");
  w->Write(m);
  w->WritesDone();
  auto s = w->Finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(s.error_message(), HasSubstr("5 of the 10 declared bytes"));
  EXPECT_EQ(client_->GetArtifact(Key()).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(ArtifactsTest, OnePutPerKeyAWaitingGetReceivesItAnAbandonedPutLeavesNothing) {
  Start({});
  auto stub = Stub();
  // A first engine begins a put and has sent part of it.
  auto ctx = std::make_unique<grpc::ClientContext>();
  v1::PutArtifactResponse resp;
  auto w = stub->PutArtifact(ctx.get(), &resp);
  v1::PutArtifactRequest m;
  *m.mutable_key() = Key();
  m.set_size(8);
  m.set_data("abcd");
  ASSERT_TRUE(w->Write(m));
  // Until the daemon has begun it, a second put could still win (it did on a busy machine):
  // wait until Status shows the first one in flight.
  ASSERT_EQ(WaitForPutsInFlight(1), 1u);
  const absl::Status second = client_->PutArtifact(Key(), "12345678").status();
  ASSERT_EQ(second.code(), absl::StatusCode::kAborted) << second;
  EXPECT_THAT(std::string(second.message()), HasSubstr("get it with wait"));
  // No torn blob for a reader that does not wait.
  EXPECT_EQ(client_->GetArtifact(Key()).status().code(), absl::StatusCode::kNotFound);
  // A reader that waits gets the whole blob once the first put commits.
  absl::StatusOr<std::unique_ptr<client::Artifact>> waited = absl::UnknownError("not run");
  std::thread reader([&] {
    auto c = client::Client::Connect(dir_ / "s");
    waited = (*c)->GetArtifact(Key(), std::chrono::seconds(60));
  });
  m.Clear();
  m.set_data("efgh");
  ASSERT_TRUE(w->Write(m));
  w->WritesDone();
  ASSERT_TRUE(w->Finish().ok());
  reader.join();
  ASSERT_TRUE(waited.ok()) << waited.status();
  EXPECT_EQ(std::string(static_cast<const char*>((*waited)->data()), 8), "abcdefgh");

  // An engine that dies mid-put (its stream cancelled) leaves nothing; the key is free again.
  auto k = Key("dir:triton");
  grpc::ClientContext cut;
  v1::PutArtifactResponse cut_resp;
  auto cw = stub->PutArtifact(&cut, &cut_resp);
  v1::PutArtifactRequest cm;
  *cm.mutable_key() = k;
  cm.set_size(8);
  cm.set_data("half");
  ASSERT_TRUE(cw->Write(cm));
  cut.TryCancel();
  (void)cw->Finish();
  absl::Status again;
  for (int i = 0; i < 500; ++i) {  // the daemon notices the cancel shortly after
    again = client_->PutArtifact(k, "complete").status();
    if (again.code() != absl::StatusCode::kAborted) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE(again.ok()) << again;
  auto got = client_->GetArtifact(k);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(std::string(static_cast<const char*>((*got)->data()), 8), "complete");
}

// A put holds a gRPC thread while it runs: a client that opens one and goes silent must not
// keep it (nor, with enough of them, every thread the daemon has).
TEST_F(ArtifactsTest, ASilentPutIsCancelledAndPutsAtOnceAreCapped) {
  DaemonOptions o;
  o.artifact_max_puts = 1;
  // Long enough that a busy machine does not cancel the silent put before the second asks.
  o.artifact_put_idle = std::chrono::milliseconds(3000);
  Start(std::move(o));
  auto stub = Stub();
  grpc::ClientContext silent;
  v1::PutArtifactResponse resp;
  // Before the stream opens: the daemon's idle clock starts when its handler does, which
  // may be before the first Write returns here.
  const auto t0 = std::chrono::steady_clock::now();
  auto w = stub->PutArtifact(&silent, &resp);
  v1::PutArtifactRequest first;  // the key and part of the bytes, then nothing
  *first.mutable_key() = Key("silent");
  first.set_size(100);
  first.set_data("part");
  ASSERT_TRUE(w->Write(first));
  ASSERT_EQ(WaitForPutsInFlight(1), 1u);  // the silent stream's handler runs
  const absl::Status second = client_->PutArtifact(Key("k"), "kernels").status();
  ASSERT_EQ(second.code(), absl::StatusCode::kResourceExhausted) << second;
  EXPECT_THAT(std::string(second.message()), HasSubstr("1 artifact puts are in progress"));
  // The silent one is cancelled after its idle time; then the slot is free again.
  const grpc::Status ended = w->Finish();
  EXPECT_FALSE(ended.ok());
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(3000));
  absl::Status again;
  for (int i = 0; i < 200; ++i) {
    again = client_->PutArtifact(Key("after" + std::to_string(i)), "kernels").status();
    if (again.code() != absl::StatusCode::kResourceExhausted) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(again.ok()) << again;
}

// A peer without the publish role opened puts and sent nothing: each took a put slot before
// its role was checked (with the first message), so such a pod held every slot and the
// admin's put was refused. Now the role is checked first: its puts are refused at once,
// take no slot, and the admin's put is served.
TEST_F(ArtifactsTest, ANonPublishersPutsTakeNoSlotTheAdminsPutIsServed) {
  DaemonOptions o;
  o.admin_uids = {::geteuid() + 4242};  // this process on the engine socket: an engine
  o.publish_uids = {::geteuid() + 4242};
  o.admin_socket_dir = dir_ / "admin";
  o.artifact_max_puts = 2;
  o.artifact_max_puts_per_unit = 2;
  o.artifact_put_idle = std::chrono::milliseconds(30000);  // the old code's slots stay held
  o.metrics = &metrics_;
  Start(std::move(o));
  auto admin = client::Client::Connect(dir_ / "admin");
  ASSERT_TRUE(admin.ok()) << admin.status();
  auto stub = Stub();
  constexpr int kPuts = 6;
  grpc::ClientContext ctx[kPuts];
  v1::PutArtifactResponse resp[kPuts];
  std::vector<std::unique_ptr<grpc::ClientWriter<v1::PutArtifactRequest>>> silent;
  for (int i = 0; i < kPuts; ++i) silent.push_back(stub->PutArtifact(&ctx[i], &resp[i]));
  // Until every silent put was answered: refused (the role), or busy (past the slots the
  // first ones took: the old code).
  const auto answered = [&](const char* result) {
    return std::max(
        0.0, Sample("weightcache_artifact_requests_total", {{"op", "put"}, {"result", result}}));
  };
  for (const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
       std::chrono::steady_clock::now() < until &&
       answered("refused") + answered("busy") < kPuts - 2;) {   // 2: the slots
    std::this_thread::sleep_for(std::chrono::milliseconds(5));  // polling with a deadline
  }
  auto put = (*admin)->PutArtifact(Key(), "the admin's kernels");
  EXPECT_TRUE(put.ok()) << put.status();
  EXPECT_EQ(answered("busy"), 0);
  for (auto& w : silent) {
    const grpc::Status s = w->Finish();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
    EXPECT_THAT(s.error_message(), HasSubstr("may not publish"));
  }
  EXPECT_EQ(answered("refused"), kPuts);
}

TEST_F(ArtifactsTest, AnArtifactTokenIsClaimedOnceAndHoldsNoLease) {
  Start({});
  ASSERT_TRUE(client_->PutArtifact(Key(), "kernels").ok());
  auto stub = Stub();
  grpc::ClientContext ctx;
  v1::GetArtifactRequest req;
  *req.mutable_key() = Key();
  v1::GetArtifactResponse resp;
  ASSERT_TRUE(stub->GetArtifact(&ctx, req, &resp).ok());
  auto claim = [&]() -> std::string {
    auto conn = ConnectUnix(resp.handle_socket());
    EXPECT_TRUE(conn.ok());
    EXPECT_TRUE(WriteAll(conn->get(), "WCH1 " + resp.token() + "\n").ok());
    auto msg = RecvWithFds(conn->get(), 256);
    return msg.ok() ? msg->data.substr(0, 4) + std::to_string(msg->fds.size()) : "error";
  };
  EXPECT_EQ(claim(), "FDS 1");
  EXPECT_EQ(claim(), "ERR 0");
  auto st = client_->Status();
  ASSERT_TRUE(st.ok());
  for (const auto& e : st->entries()) EXPECT_EQ(e.lease_count(), 0u) << e.DebugString();
}

TEST_F(ArtifactsTest, AnAdminEvictsAndTheDirectoryKeepsThemAcrossARestart) {
  const std::string art_dir = dir_ / "artifacts";
  {
    DaemonOptions o;
    o.artifact_dir = art_dir;
    Start(std::move(o));
    ASSERT_TRUE(client_->PutArtifact(Key("a"), "kept").ok());
    auto b = client_->PutArtifact(Key("b"), "evicted");
    ASSERT_TRUE(b.ok());
    auto n = client_->EvictArtifacts(b->id(), "");
    ASSERT_TRUE(n.ok()) << n.status();
    EXPECT_EQ(*n, 1u);
    client_.reset();
    daemon_->Shutdown();
    daemon_->Wait();
    daemon_.reset();
  }
  struct stat st {};
  ASSERT_EQ(::stat(art_dir.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  DaemonOptions o;
  o.artifact_dir = art_dir;
  Start(std::move(o));
  auto got = client_->GetArtifact(Key("a"));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(std::string(static_cast<const char*>((*got)->data()), 4), "kept");
  EXPECT_EQ(client_->GetArtifact(Key("b")).status().code(), absl::StatusCode::kNotFound);
  auto s = client_->Status();
  ASSERT_TRUE(s.ok());
  ASSERT_EQ(s->artifacts_size(), 1);
  EXPECT_TRUE(s->artifacts(0).on_disk());
  EXPECT_EQ(s->artifact_usage().dir(), art_dir);
}

// Issue 47, finding 8: a blob in --artifact_dir that was a symlink to a FIFO hung GetArtifact
// past its deadline (open waited for a writer), and SIGTERM then needed the watchdog
// (11.45 s). Now it is refused at once, naming the blob, and the daemon stops promptly. On
// the old code the get ends DEADLINE_EXCEEDED at 5 s (the test then unblocks the FIFO so it
// does not hang).
TEST_F(ArtifactsTest, ABlobThatIsAFifoIsRefusedAndShutdownIsPrompt) {
  const std::string art_dir = dir_ / "artifacts";
  std::string id;
  {
    DaemonOptions o;
    o.artifact_dir = art_dir;
    Start(std::move(o));
    auto put = client_->PutArtifact(Key(), "kernels");
    ASSERT_TRUE(put.ok()) << put.status();
    id = put->id();
    client_.reset();
    daemon_->Shutdown();
    daemon_->Wait();
    daemon_.reset();
  }
  const std::string blob = art_dir + "/" + id + ".blob";
  const std::string fifo = dir_ / "elsewhere.fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  ASSERT_EQ(::unlink(blob.c_str()), 0);
  ASSERT_EQ(::symlink(fifo.c_str(), blob.c_str()), 0);
  DaemonOptions o;
  o.artifact_dir = art_dir;
  Start(std::move(o));
  auto stub = Stub();
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  v1::GetArtifactRequest req;
  *req.mutable_key() = Key();
  v1::GetArtifactResponse resp;
  const auto t0 = std::chrono::steady_clock::now();
  const grpc::Status got = stub->GetArtifact(&ctx, req, &resp);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  EXPECT_EQ(got.error_code(), grpc::StatusCode::DATA_LOSS) << got.error_message();
  EXPECT_THAT(got.error_message(), HasSubstr(blob));
  EXPECT_THAT(got.error_message(), HasSubstr("symbolic link"));
  if (got.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
    const int w = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);  // lets the old code go
    if (w >= 0) ::close(w);
  }
  client_.reset();
  const auto t1 = std::chrono::steady_clock::now();
  daemon_->Shutdown();
  daemon_->Wait();
  EXPECT_LT(std::chrono::steady_clock::now() - t1, std::chrono::seconds(5));
  daemon_.reset();
}

}  // namespace
// Metrics (weightcache_artifact_*): each get and put by result, the bytes served and stored,
// and the memory the store holds.
TEST_F(ArtifactsTest, GetsAndPutsAreCountedByResult) {
  DaemonOptions o;
  o.metrics = &metrics_;
  Start(std::move(o));
  const std::string blob = Pattern(70000);
  ASSERT_TRUE(client_->PutArtifact(Key(), blob).ok());
  EXPECT_EQ(client_->PutArtifact(Key(), blob).status().code(), absl::StatusCode::kAlreadyExists);
  ASSERT_TRUE(client_->GetArtifact(Key()).ok());
  ASSERT_TRUE(client_->GetArtifact(Key()).ok());
  EXPECT_EQ(client_->GetArtifact(Key("triton-cache")).status().code(), absl::StatusCode::kNotFound);
  const std::string r = "weightcache_artifact_requests_total";
  EXPECT_EQ(Sample(r, {{"model", "m"}, {"op", "put"}, {"result", "stored"}}), 1);
  EXPECT_EQ(Sample(r, {{"model", "m"}, {"op", "put"}, {"result", "exists"}}), 1);
  EXPECT_EQ(Sample(r, {{"model", "m"}, {"op", "get"}, {"result", "hit"}}), 2);
  EXPECT_EQ(Sample(r, {{"model", "m"}, {"op", "get"}, {"result", "miss"}}), 1);
  EXPECT_EQ(Sample("weightcache_artifact_bytes_total", {{"op", "get"}}), 2.0 * blob.size());
  EXPECT_EQ(Sample("weightcache_artifact_bytes_total", {{"op", "put"}}), 1.0 * blob.size());
  EXPECT_EQ(Sample("weightcache_artifact_resident_bytes"), 1.0 * blob.size());
}

}  // namespace weightcache::server
