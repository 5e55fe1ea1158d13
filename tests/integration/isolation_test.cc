// Private copies per namespace (issue 27, item 4): a spec with `isolation: namespace` gets one
// entry per (fingerprint, Kubernetes namespace), each pod maps only its own namespace's copy,
// and each copy counts in the budget. A real weightcached with --namespace_rules, real
// clients on per-slot sockets, a fake kubelet saying which pod holds which slot.
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "pkg/client/client.h"
#include "pkg/safetensors/writer.h"
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
using ::testing::Not;
using testing::TempDir;

class IsolationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(safetensors::WriteLlamaCheckpoint(dir_ / "m", testing::SmallLlama()).ok());
    // One checkpoint under three names: private to team-a and team-b (a copy each, preloaded),
    // private to whoever asks (no list: nothing preloaded), and shared.
    std::ofstream(dir_ / "specs.yaml")
        << "models:\n"
        << "  - {name: private, model_dir: " << dir_ / "m"
        << ", allowed_namespaces: [team-a, team-b], isolation: namespace}\n"
        << "  - {name: anyone, model_dir: " << dir_ / "m"
        << ", isolation: namespace}\n"
        << "  - {name: open, model_dir: " << dir_ / "m"
        << "}\n";
    kubelet_ = std::make_unique<FakeKubelet>(dir_ / "pr.sock");
    ASSERT_TRUE(kubelet_->serving());
    kubelet_->Assign("weightcache-1", "team-a", "engine-a");
    kubelet_->Assign("weightcache-2", "team-c", "engine-c");
    kubelet_->Assign("weightcache-3", "team-b", "engine-b");
    auto d =
        testing::StartDaemon({WEIGHTCACHED_PATH, "--socket_dir=" + socket_dir(), "--backend=host",
                              "--metrics_address=127.0.0.1:0", "--spec_file=" + dir_ / "specs.yaml",
                              "--namespace_rules", "--device_plugin_slots=4",
                              "--pod_resources_socket=" + dir_ / "pr.sock", "--admin_uids=4242"},
                             socket_dir(), dir_ / "daemon.log");
    ASSERT_TRUE(d.ok()) << d.status();
    daemon_ = std::move(d->process);
    shared_ = std::move(d->client);
    admin_ = testing::AdminClient(socket_dir());
    ASSERT_NE(admin_, nullptr);
    // The shared entry and the two preloaded private copies.
    testing::WaitForStatus(
        *admin_,
        [](const v1::StatusResponse& s) {
          return s.entries_size() == 3 &&
                 std::all_of(s.entries().begin(), s.entries().end(),
                             [](const v1::EntryInfo& e) { return e.state() == "ready"; });
        },
        20s);
  }

  std::string socket_dir() const { return dir_ / "s"; }
  std::unique_ptr<client::Client> OnSlot(int i) {
    auto c = client::Client::Connect(socket_dir() + "/slots/weightcache-" + std::to_string(i) +
                                     "/control.sock");
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? *std::move(c) : nullptr;
  }
  static absl::StatusOr<std::unique_ptr<client::Lease>> Acquire(client::Client& c,
                                                                const std::string& model,
                                                                bool load_on_miss = false) {
    client::AcquireOptions o;
    o.model = model;
    o.load_on_miss = load_on_miss;
    return c.Acquire(o);
  }
  // The admin's view: tenant -> entry, for the entries of `model`.
  std::map<std::string, v1::EntryInfo> Copies(const std::string& model) {
    std::map<std::string, v1::EntryInfo> out;
    auto st = admin_->Status();
    EXPECT_TRUE(st.ok()) << st.status();
    if (!st.ok()) return out;
    for (const auto& e : st->entries()) {
      if (e.model() == model) out[e.tenant()] = e;
    }
    return out;
  }

  TempDir dir_;
  std::unique_ptr<FakeKubelet> kubelet_;
  std::unique_ptr<testing::Process> daemon_;
  std::unique_ptr<client::Client> shared_, admin_;
};

TEST_F(IsolationTest, EachNamespaceMapsItsOwnCopyCountedInTheBudget) {
  auto copies = Copies("private");
  ASSERT_EQ(copies.size(), 2u);
  ASSERT_TRUE(copies.count("team-a") && copies.count("team-b"));
  const std::string fp_a = copies["team-a"].fingerprint();
  const std::string fp_b = copies["team-b"].fingerprint();
  EXPECT_NE(fp_a, fp_b);

  auto a = OnSlot(1);
  auto b = OnSlot(3);
  ASSERT_TRUE(a && b);
  auto la = Acquire(*a, "private");
  ASSERT_TRUE(la.ok()) << la.status();
  auto lb = Acquire(*b, "private");
  ASSERT_TRUE(lb.ok()) << lb.status();
  EXPECT_EQ((*la)->fingerprint(), fp_a);
  EXPECT_EQ((*lb)->fingerprint(), fp_b);
  // The same bytes in two places: each pod's writes (cuda-vmm) reach only its own team.
  const client::TensorView* ta = (*la)->Find("lm_head.weight");
  const client::TensorView* tb = (*lb)->Find("lm_head.weight");
  ASSERT_TRUE(ta && tb);
  ASSERT_EQ(ta->nbytes, tb->nbytes);
  EXPECT_EQ(std::memcmp(ta->data, tb->data, ta->nbytes), 0);
  // The shared name of the same checkpoint is a third entry, not either private copy.
  auto open = Acquire(*a, "open");
  ASSERT_TRUE(open.ok()) << open.status();
  EXPECT_NE((*open)->fingerprint(), fp_a);
  EXPECT_NE((*open)->fingerprint(), fp_b);

  // Every copy is resident memory of its own, counted on the device.
  auto st = admin_->Status();
  ASSERT_TRUE(st.ok()) << st.status();
  uint64_t sum = 0;
  for (const auto& e : st->entries()) sum += e.bytes();
  ASSERT_EQ(st->devices_size(), 1);
  EXPECT_EQ(st->devices(0).entries(), 3u);
  EXPECT_EQ(st->devices(0).cache_bytes(), sum);
  EXPECT_EQ(sum, 3 * copies["team-a"].bytes());

  testing::ToolRun status = testing::RunTool(
      {WEIGHTCACHECTL_PATH, "--socket=" + socket_dir() + "-admin", "status"}, dir_ / "ctl.err");
  EXPECT_EQ(status.rc, 0) << status.out;
  EXPECT_THAT(status.out, HasSubstr("  private copy of namespace team-a (isolation: namespace)"));
  EXPECT_THAT(status.out, HasSubstr("  private copy of namespace team-b (isolation: namespace)"));
  testing::ToolRun list = testing::RunTool(
      {WEIGHTCACHECTL_PATH, "--socket=" + socket_dir() + "-admin", "list"}, dir_ / "ctl.err");
  EXPECT_THAT(list.out, HasSubstr("  isolation: namespace (a private copy per namespace"));
}

TEST_F(IsolationTest, APodNeverMapsOrSeesAnotherNamespacesCopy) {
  const std::string fp_a = Copies("private")["team-a"].fingerprint();
  ASSERT_FALSE(fp_a.empty());
  auto b = OnSlot(3);
  ASSERT_TRUE(b);
  // By fingerprint: team-a's copy is refused to team-b's pod, without naming team-a.
  client::AcquireOptions by_fp;
  by_fp.fingerprint = fp_a;
  auto stolen = b->Acquire(by_fp);
  ASSERT_EQ(stolen.status().code(), absl::StatusCode::kPermissionDenied) << stolen.status();
  EXPECT_THAT(std::string(stolen.status().message()),
              HasSubstr("is another namespace's private copy (isolation: namespace); this pod is "
                        "in 'team-b'"));
  EXPECT_THAT(std::string(stolen.status().message()), Not(HasSubstr("team-a")));
  // Through the shared name of the same checkpoint: a different entry, not team-a's.
  auto open = Acquire(*b, "open");
  ASSERT_TRUE(open.ok()) << open.status();
  EXPECT_NE((*open)->fingerprint(), fp_a);
  // Status: team-b's pod sees its own copy of `private` and the shared entry, not team-a's.
  auto st = b->Status();
  ASSERT_TRUE(st.ok()) << st.status();
  std::set<std::string> seen;
  for (const auto& e : st->entries()) seen.insert(e.model() + "/" + e.tenant());
  EXPECT_EQ(seen, (std::set<std::string>{"open/", "private/team-b"}));
  EXPECT_EQ(st->devices(0).entries(), 3u);  // the device row stays whole
  // The shared socket names no namespace: no private copy from there, whoever asks.
  auto shared = Acquire(*shared_, "anyone");
  EXPECT_EQ(shared.status().code(), absl::StatusCode::kFailedPrecondition) << shared.status();
  EXPECT_THAT(std::string(shared.status().message()),
              HasSubstr("keeps a private copy per Kubernetes namespace (isolation: namespace)"));
  // Evicting the shared name leaves the private copies alone.
  auto evicted = admin_->EvictDetailed("open", "");
  ASSERT_TRUE(evicted.ok()) << evicted.status();
  EXPECT_EQ(evicted->evicted(), 1u);
  EXPECT_EQ(Copies("private").size(), 2u);
}

// A private model that lists no namespace has no copy until a pod asks: then its own.
TEST_F(IsolationTest, ACopyIsLoadedForTheNamespaceThatAsks) {
  EXPECT_TRUE(Copies("anyone").empty());
  auto c = OnSlot(2);  // team-c: listed nowhere, and `anyone` is open to all
  ASSERT_TRUE(c);
  auto miss = Acquire(*c, "anyone");
  EXPECT_EQ(miss.status().code(), absl::StatusCode::kNotFound) << miss.status();
  auto lease = Acquire(*c, "anyone", /*load_on_miss=*/true);
  ASSERT_TRUE(lease.ok()) << lease.status();
  auto copies = Copies("anyone");
  ASSERT_EQ(copies.size(), 1u);
  EXPECT_EQ(copies.begin()->first, "team-c");
  EXPECT_EQ(copies.begin()->second.fingerprint(), (*lease)->fingerprint());
  // An admin's Load of it names no namespace: refused, saying why.
  absl::Status load = admin_->Load("anyone", "", {});
  EXPECT_EQ(load.code(), absl::StatusCode::kFailedPrecondition) << load;
  EXPECT_THAT(std::string(load.message()), HasSubstr("lists no allowed_namespaces"));
  // A pod's Load fills its own namespace's copy; team-a has one of these bytes already (under
  // `private`): a namespace's copy of one checkpoint serves all its private names.
  auto a = OnSlot(1);
  ASSERT_TRUE(a);
  ASSERT_TRUE(a->Load("anyone", "", {}).ok());
  auto st = admin_->Status();
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_EQ(st->entries_size(), 4);  // open, private x2, anyone for team-c
  auto mine = Acquire(*a, "anyone");
  ASSERT_TRUE(mine.ok()) << mine.status();
  EXPECT_EQ((*mine)->fingerprint(), Copies("private")["team-a"].fingerprint());
  EXPECT_NE((*mine)->fingerprint(), (*lease)->fingerprint());
}

// Without --namespace_rules nothing names a caller's namespace: the daemon refuses the spec
// at start, naming the model and the flag (and loses nothing: it never served).
TEST(IsolationStartTest, APrivateSpecWithoutNamespaceRulesIsRefusedAtStart) {
  TempDir dir;
  std::ofstream(dir / "specs.yaml") << "{name: private, model_dir: " << dir / "m"
                                    << ", isolation: namespace}\n";
  testing::ToolRun run =
      testing::RunTool({WEIGHTCACHED_PATH, "--socket_dir=" + dir / "s", "--backend=host",
                        "--metrics_address=off", "--spec_file=" + dir / "specs.yaml"},
                       dir / "daemon.err");
  EXPECT_NE(run.rc, 0);
  EXPECT_THAT(run.out, HasSubstr("model 'private': isolation: namespace (a private copy per "
                                 "Kubernetes namespace) needs the daemon's --namespace_rules"));
}

}  // namespace
}  // namespace weightcache
