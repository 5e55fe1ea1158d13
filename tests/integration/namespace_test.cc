// Per-model namespace rules end to end (issue 18): a real weightcached with --namespace_rules,
// real clients connecting through per-slot socket directories, and a fake kubelet serving the
// PodResources API (real gRPC on a Unix socket) that says which pod holds which slot.
#include <grpcpp/grpcpp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "pkg/client/client.h"
#include "pkg/safetensors/writer.h"
#include "pkg/util/scoped_fd.h"
#include "pkg/util/unix_socket.h"
#include "podresources/v1/api.grpc.pb.h"
#include "tests/integration/daemon_harness.h"
#include "tests/integration/fake_kubelet.h"
#include "tests/integration/process.h"
#include "tests/testutil/temp_dir.h"
#include "weightcache/v1/weightcache.grpc.pb.h"

namespace weightcache {
namespace {

using namespace std::chrono_literals;
using testing::FakeKubelet;
using ::testing::HasSubstr;
using testing::TempDir;

class NamespaceRulesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(safetensors::WriteLlamaCheckpoint(dir_ / "m", testing::SmallLlama()).ok());
    // Two names for one checkpoint: the rule is not weights identity, so both have one
    // fingerprint.
    std::ofstream(dir_ / "specs.yaml") << "models:\n"
                                       << "  - {name: secret, model_dir: " << dir_ / "m"
                                       << ", allowed_namespaces: [team-a]}\n"
                                       << "  - {name: open, model_dir: " << dir_ / "m"
                                       << "}\n";
    kubelet_ = std::make_unique<FakeKubelet>(dir_ / "pr.sock");
    ASSERT_TRUE(kubelet_->serving());
    kubelet_->Assign("weightcache-1", "team-a", "engine-a");
    kubelet_->Assign("weightcache-3", "team-b", "engine-0");
    // --admin_uids names someone else: this test's own uid is an engine on the shared socket.
    auto d = testing::StartDaemon(
        {WEIGHTCACHED_PATH, "--socket_dir=" + socket_dir(), "--backend=host",
         "--metrics_address=127.0.0.1:0", "--spec_file=" + dir_ / "specs.yaml", "--namespace_rules",
         "--device_plugin_slots=4", "--pod_resources_socket=" + dir_ / "pr.sock",
         "--admin_uids=4242", "--publish_namespaces=team-a,team-b"},
        socket_dir(), dir_ / "daemon.log", [](const v1::StatusResponse& s) {
          return s.entries_size() == 1 && s.entries(0).state() == "ready";
        });
    ASSERT_TRUE(d.ok()) << d.status();
    daemon_ = std::move(d->process);
    shared_ = std::move(d->client);
  }

  std::string socket_dir() const { return dir_ / "s"; }
  std::string slot_dir(int i) const {
    return socket_dir() + "/slots/weightcache-" + std::to_string(i);
  }
  // A fresh connection on slot i's control socket, as an engine in the pod holding it.
  std::unique_ptr<client::Client> OnSlot(int i) {
    auto c = client::Client::Connect(slot_dir(i) + "/control.sock");
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? *std::move(c) : nullptr;
  }
  static absl::StatusOr<std::unique_ptr<client::Lease>> Acquire(client::Client& c,
                                                                const std::string& model) {
    client::AcquireOptions o;
    o.model = model;
    return c.Acquire(o);
  }
  int MetricsPort() { return testing::MetricsPort(dir_ / "daemon.log"); }

  TempDir dir_;
  std::unique_ptr<FakeKubelet> kubelet_;
  std::unique_ptr<testing::Process> daemon_;
  std::unique_ptr<client::Client> shared_;
};

TEST_F(NamespaceRulesTest, PodsInAllowedNamespacesMapOthersAreDeniedAndCounted) {
  // Each slot has its own directory with both sockets, 0750, and the node's probe decision
  // (the directory is all its pod mounts; issue 49).
  for (int i = 0; i < 4; ++i) {
    EXPECT_TRUE(std::filesystem::is_socket(slot_dir(i) + "/control.sock")) << i;
    EXPECT_TRUE(std::filesystem::is_socket(slot_dir(i) + "/handle.sock")) << i;
    EXPECT_TRUE(std::filesystem::is_regular_file(slot_dir(i) + "/node-probes.json")) << i;
    EXPECT_EQ(std::filesystem::status(slot_dir(i)).permissions() & std::filesystem::perms::all,
              std::filesystem::perms(0750));
  }
  auto a = OnSlot(1);
  auto b = OnSlot(3);
  ASSERT_TRUE(a && b);
  auto lease = Acquire(*a, "secret");
  ASSERT_TRUE(lease.ok()) << lease.status();
  ASSERT_NE((*lease)->Find("lm_head.weight"), nullptr);
  EXPECT_GT((*lease)->segment_count(), 0u);

  auto denied = Acquire(*b, "secret");
  ASSERT_EQ(denied.status().code(), absl::StatusCode::kPermissionDenied) << denied.status();
  EXPECT_EQ(denied.status().message(),
            "model 'secret' may be mapped from namespaces [team-a] only; this pod "
            "(team-b/engine-0, slot weightcache-3) is in 'team-b'");
  // The open name of the same weights is open to every slot, with the same fingerprint:
  // allowed_namespaces is not part of the weights' identity.
  auto open = Acquire(*b, "open");
  ASSERT_TRUE(open.ok()) << open.status();
  EXPECT_EQ((*open)->fingerprint(), (*lease)->fingerprint());
  // By fingerprint: the entry's model is 'secret', so its rule applies.
  client::AcquireOptions by_fp;
  by_fp.fingerprint = (*lease)->fingerprint();
  EXPECT_EQ(b->Acquire(by_fp).status().code(), absl::StatusCode::kPermissionDenied);
  // Nor may team-b load it.
  absl::Status load = b->Load("secret", "", {});
  EXPECT_EQ(load.code(), absl::StatusCode::kPermissionDenied) << load;
  // The shared socket identifies no pod: refused to non-admin peers.
  auto shared = Acquire(*shared_, "secret");
  EXPECT_EQ(shared.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(shared.status().message()), HasSubstr("came in on the shared socket"));

  auto st = shared_->Status();
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_EQ(st->acquire_denied(), 3u);  // two Acquires on slot 3, one on the shared socket
  // A team-a pod's Status lists the restricted model with its rule.
  st = a->Status();
  ASSERT_TRUE(st.ok()) << st.status();
  ASSERT_EQ(st->models_size(), 2) << st->DebugString();
  for (const auto& m : st->models()) {
    EXPECT_EQ(
        std::vector<std::string>(m.allowed_namespaces().begin(), m.allowed_namespaces().end()),
        m.name() == "secret" ? std::vector<std::string>{"team-a"} : std::vector<std::string>{})
        << m.name();
  }
  testing::ToolRun list =
      testing::RunTool({WEIGHTCACHECTL_PATH, "--socket=" + slot_dir(1), "list"}, dir_ / "ctl.err");
  EXPECT_EQ(list.rc, 0) << list.out;
  EXPECT_THAT(list.out, HasSubstr("\n  namespaces: team-a (only pods there may map it)\n"));
  testing::ToolRun status = testing::RunTool(
      {WEIGHTCACHECTL_PATH, "--socket=" + socket_dir(), "status"}, dir_ / "ctl.err");
  EXPECT_THAT(status.out, HasSubstr(" 3 denied, "));
  const int port = MetricsPort();
  ASSERT_GT(port, 0) << testing::ReadFileOrEmpty(dir_ / "daemon.log");
  const std::string scrape = testing::Scrape(port);
  EXPECT_THAT(scrape, HasSubstr("weightcache_acquire_total{model=\"secret\",result=\"denied\"} 3"));
  EXPECT_THAT(scrape, HasSubstr("weightcache_acquire_total{model=\"secret\",result=\"hit\"} 1"));
  EXPECT_THAT(scrape, HasSubstr("weightcache_refusals_total{rule=\"namespace\"} 1"));
}

// Status answers what the caller may map: the restricted model, the names it gives an entry
// and other sockets' leases are not shown to a pod of another namespace (nor to a non-admin
// on the shared socket). A lease is released only on the socket it was acquired on: every
// connection here has the same uid, which is what pods running as root look like.
TEST_F(NamespaceRulesTest, StatusShowsWhatTheCallerMayMapAndLeasesAreReleasedOnTheirOwnSlot) {
  auto a = OnSlot(1);
  auto b = OnSlot(3);
  ASSERT_TRUE(a && b);
  auto secret = Acquire(*a, "secret");
  ASSERT_TRUE(secret.ok()) << secret.status();
  auto open = Acquire(*b, "open");
  ASSERT_TRUE(open.ok()) << open.status();
  auto names = [](const auto& list) {
    std::vector<std::string> out(list.begin(), list.end());
    std::sort(out.begin(), out.end());
    return out;
  };
  auto lease_ids = [](const v1::StatusResponse& st) {
    std::vector<std::string> out;
    for (const auto& e : st.entries()) {
      for (const auto& l : e.leases()) out.push_back(l.lease_id());
    }
    return out;
  };
  using Names = std::vector<std::string>;
  for (client::Client* c : {b.get(), shared_.get()}) {
    auto st = c->Status();
    ASSERT_TRUE(st.ok()) << st.status();
    EXPECT_EQ(names(st->known_models()), Names{"open"});
    ASSERT_EQ(st->models_size(), 1);
    EXPECT_EQ(st->models(0).name(), "open");
    ASSERT_EQ(st->entries_size(), 1) << st->DebugString();
    EXPECT_EQ(st->entries(0).model(), "open");
    EXPECT_EQ(names(st->entries(0).names()), Names{"open"});
    EXPECT_EQ(lease_ids(*st), c == b.get() ? Names{(*open)->id()} : Names{});
    EXPECT_EQ(st->devices(0).entries(), 1u);  // the device row counts every entry
  }
  auto st = a->Status();
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_EQ(names(st->known_models()), (Names{"open", "secret"}));
  ASSERT_EQ(st->entries_size(), 1);
  EXPECT_EQ(names(st->entries(0).names()), (Names{"open", "secret"}));
  EXPECT_EQ(lease_ids(*st), Names{(*secret)->id()});

  // Team-a's lease: not from team-b's slot, not from the shared socket; from its own, yes.
  absl::Status from_b = b->Release((*secret)->id());
  EXPECT_EQ(from_b.code(), absl::StatusCode::kPermissionDenied) << from_b;
  EXPECT_THAT(std::string(from_b.message()),
              HasSubstr("was acquired by another slot's pod (slot weightcache-1's socket) than "
                        "this connection's (slot weightcache-3)"));
  absl::Status from_shared = shared_->Release((*secret)->id());
  EXPECT_EQ(from_shared.code(), absl::StatusCode::kPermissionDenied) << from_shared;
  EXPECT_THAT(std::string(from_shared.message()),
              HasSubstr("was acquired by another slot's pod (slot weightcache-1's socket)"));
  EXPECT_TRUE(a->Release((*secret)->id()).ok());
  st = a->Status();
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(lease_ids(*st), Names{});
}

TEST_F(NamespaceRulesTest, AReassignedSlotIsAskedAboutAfresh) {
  {
    auto a = OnSlot(1);
    ASSERT_TRUE(Acquire(*a, "secret").ok());  // team-a's answer is now cached for slot 1
  }
  // Slot 1 goes to a team-b pod and slot 3 to a team-a pod, well within the cache's 2 s.
  kubelet_->Assign("weightcache-1", "team-b", "intruder");
  kubelet_->Assign("weightcache-3", "team-a", "engine-new");
  auto now_b = OnSlot(1);
  auto denied = Acquire(*now_b, "secret");
  EXPECT_EQ(denied.status().code(), absl::StatusCode::kPermissionDenied) << denied.status();
  EXPECT_THAT(std::string(denied.status().message()),
              HasSubstr("(team-b/intruder, slot weightcache-1)"));
  auto now_a = OnSlot(3);
  EXPECT_TRUE(Acquire(*now_a, "secret").ok());
}

TEST_F(NamespaceRulesTest, TokensAreClaimableOnlyOnTheirOwnSlotsHandleSocket) {
  auto channel = grpc::CreateChannel("unix:" + slot_dir(1) + "/control.sock",
                                     grpc::InsecureChannelCredentials());
  auto stub = v1::WeightCache::NewStub(channel);
  v1::AcquireRequest req;
  req.set_model("secret");
  req.mutable_layout()->set_tp_size(1);
  v1::AcquireResponse resp;
  grpc::ClientContext ctx;
  ASSERT_TRUE(stub->Acquire(&ctx, req, &resp).ok());
  // The daemon names the handle socket as the engine's container sees its slot directory.
  EXPECT_EQ(resp.handle_socket(), socket_dir() + "/handle.sock");
  for (const std::string& other : {slot_dir(3) + "/handle.sock", socket_dir() + "/handle.sock"}) {
    auto fd = ConnectUnix(other);
    ASSERT_TRUE(fd.ok()) << fd.status();
    ASSERT_TRUE(WriteAll(fd->get(), "WCH1 " + resp.token() + "\n").ok());
    auto got = RecvWithFds(fd->get(), 512);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_THAT(got->data, HasSubstr("ERR PERMISSION_DENIED: this token was issued on slot "
                                     "weightcache-1's socket"));
    EXPECT_TRUE(got->fds.empty());
  }
  auto fd = ConnectUnix(slot_dir(1) + "/handle.sock");
  ASSERT_TRUE(fd.ok());
  ASSERT_TRUE(WriteAll(fd->get(), "WCH1 " + resp.token() + "\n").ok());
  auto got = RecvWithFds(fd->get(), 512);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->data.rfind("FDS ", 0), 0u) << got->data;
  EXPECT_FALSE(got->fds.empty());
}

// A publish belongs to the socket it was begun on: its writable descriptors are claimable
// on that slot's handle socket only, and only that socket commits or aborts it (one uid for
// every connection here, as pods running as root look).
TEST_F(NamespaceRulesTest, APublishIsBoundToTheSlotItWasBegunOn) {
  auto stub_on = [&](int slot) {
    return v1::WeightCache::NewStub(grpc::CreateChannel("unix:" + slot_dir(slot) + "/control.sock",
                                                        grpc::InsecureChannelCredentials()));
  };
  auto a = stub_on(1);
  auto b = stub_on(3);
  v1::BeginPublishRequest begin;
  begin.set_model("open");
  begin.mutable_layout()->set_tp_size(1);
  begin.mutable_env()->set_engine("testengine");
  begin.mutable_env()->set_recipe("slot-bound");
  auto* t = begin.add_tensors();
  t->set_name("w");
  t->set_dtype("F32");
  t->add_shape(256);
  t->set_nbytes(1024);
  v1::BeginPublishResponse begun;
  {
    grpc::ClientContext ctx;
    grpc::Status s = a->BeginPublish(&ctx, begin, &begun);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  ASSERT_FALSE(begun.token().empty());
  auto claim = [&](const std::string& handle_socket) {
    auto fd = ConnectUnix(handle_socket);
    EXPECT_TRUE(fd.ok()) << fd.status();
    if (!fd.ok()) return std::string();
    EXPECT_TRUE(WriteAll(fd->get(), "WCH1 " + begun.token() + "\n").ok());
    auto got = RecvWithFds(fd->get(), 512);
    EXPECT_TRUE(got.ok()) << got.status();
    return got.ok() ? got->data : std::string();
  };
  EXPECT_THAT(claim(slot_dir(3) + "/handle.sock"),
              HasSubstr("ERR PERMISSION_DENIED: this publish token was issued on slot "
                        "weightcache-1's socket"));
  v1::CommitPublishRequest commit;
  commit.set_publish_id(begun.publish_id());
  *commit.mutable_tensors() = begin.tensors();
  v1::CommitPublishResponse committed;
  {
    grpc::ClientContext ctx;
    grpc::Status s = b->CommitPublish(&ctx, commit, &committed);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
    EXPECT_THAT(s.error_message(),
                HasSubstr("was begun on slot weightcache-1's socket; it may be committed or "
                          "aborted there only, not on slot weightcache-3's socket"));
  }
  v1::AbortPublishRequest abort;
  abort.set_publish_id(begun.publish_id());
  v1::AbortPublishResponse aborted;
  {
    grpc::ClientContext ctx;
    EXPECT_EQ(b->AbortPublish(&ctx, abort, &aborted).error_code(),
              grpc::StatusCode::PERMISSION_DENIED);
  }
  // The token stayed valid where it belongs (the connection held: closing it would abort
  // the publish), and the publish ends on its own slot.
  auto own = ConnectUnix(slot_dir(1) + "/handle.sock");
  ASSERT_TRUE(own.ok()) << own.status();
  ASSERT_TRUE(WriteAll(own->get(), "WCH1 " + begun.token() + "\n").ok());
  auto fds = RecvWithFds(own->get(), 512);
  ASSERT_TRUE(fds.ok()) << fds.status();
  EXPECT_EQ(fds->data.rfind("FDS ", 0), 0u) << fds->data;
  EXPECT_FALSE(fds->fds.empty());
  {
    grpc::ClientContext ctx;
    grpc::Status s = a->AbortPublish(&ctx, abort, &aborted);
    EXPECT_TRUE(s.ok()) << s.error_message();
  }
}

// Attack (issue 25): with the namespace rules on, a root pod on any slot could BeginPublish
// bytes of its choice for an open model, and every other tenant's acquire_or_publish of
// that recipe then mapped them. Answer: publishing is granted per namespace
// (--publish_namespaces: team-a and team-b here); a pod of another namespace is refused,
// and so is a slot no pod holds.
TEST_F(NamespaceRulesTest, OnlyPodsOfGrantedNamespacesPublish) {
  kubelet_->Assign("weightcache-2", "team-c", "intruder");
  v1::BeginPublishRequest begin;
  begin.set_model("open");
  begin.mutable_layout()->set_tp_size(1);
  begin.mutable_env()->set_engine("testengine");
  begin.mutable_env()->set_recipe("poisoned");
  auto* t = begin.add_tensors();
  t->set_name("w");
  t->set_dtype("F32");
  t->add_shape(256);
  t->set_nbytes(1024);
  for (int slot : {2, 0}) {
    auto stub = v1::WeightCache::NewStub(grpc::CreateChannel(
        "unix:" + slot_dir(slot) + "/control.sock", grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    v1::BeginPublishResponse begun;
    grpc::Status s = stub->BeginPublish(&ctx, begin, &begun);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << "slot " << slot;
    EXPECT_THAT(s.error_message(), HasSubstr("may not publish weights")) << slot;
    EXPECT_THAT(s.error_message(), HasSubstr(slot == 2 ? "(team-c/intruder) is in 'team-c'"
                                                       : "could not be identified"));
    EXPECT_TRUE(begun.token().empty());
  }
}

TEST_F(NamespaceRulesTest, UnreachablePodResourcesFailsClosed) {
  kubelet_->Stop();
  std::filesystem::remove(dir_ / "pr.sock");
  auto a = OnSlot(1);  // team-a's slot, but nobody can say so now
  auto denied = Acquire(*a, "secret");
  ASSERT_EQ(denied.status().code(), absl::StatusCode::kPermissionDenied) << denied.status();
  EXPECT_THAT(std::string(denied.status().message()),
              HasSubstr("model 'secret' may be mapped from namespaces [team-a] only; the pod on "
                        "slot weightcache-1 could not be identified, so it is refused (fail "
                        "closed): kubelet PodResources API (" +
                        dir_ / "pr.sock" + "): List: "));
  // Open models do not depend on the kubelet.
  EXPECT_TRUE(Acquire(*a, "open").ok());
  // A slot no pod holds: denied, saying so.
  auto nobody = OnSlot(2);
  kubelet_ = std::make_unique<FakeKubelet>(dir_ / "pr.sock");
  ASSERT_TRUE(kubelet_->serving());
  auto unheld = Acquire(*nobody, "secret");
  EXPECT_EQ(unheld.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(unheld.status().message()),
              HasSubstr("the kubelet reports no pod holding slot weightcache-2"));
}

}  // namespace
}  // namespace weightcache
