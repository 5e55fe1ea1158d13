// The keeper link against a real keeper (in this process) and a real registry: what it
// deposits when a load's thread is slow to turn its entry ready.
#include "pkg/server/keeper/keeper_link.h"

#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include "gtest/gtest.h"
#include "pkg/cache/registry.h"
#include "pkg/integrity/crypto_digest.h"
#include "pkg/keeper/server.h"
#include "pkg/memory/backend.h"
#include "tests/testutil/temp_dir.h"

namespace weightcache::server {
namespace {

using std::chrono::milliseconds;

// Passes the registry's notices on to the link, then holds the load's thread, as a busy
// node's scheduler may, between BeforeReady and the entry turning ready.
class SlowToReady final : public cache::EntryObserver {
 public:
  SlowToReady(KeeperLink* link, milliseconds hold) : link_(link), hold_(hold) {}
  void BeforeReady(const cache::Entry& e, const load::LoadedModel& content) override {
    link_->BeforeReady(e, content);
    std::this_thread::sleep_for(hold_);
  }
  void Evicted(const cache::Entry& e) override { link_->Evicted(e); }

 private:
  KeeperLink* link_;
  milliseconds hold_;
};

cache::LoadRequest OneSegmentLoad(memory::Backend* backend) {
  spec::FingerprintInputs in;
  in.architecture = "LlamaForCausalLM";
  in.files.push_back({"model.safetensors", 8192, "sha256:abc"});
  in.layout = {2, 1, 1, 0};
  in.dtype = "bf16";
  cache::LoadRequest req;
  req.key = {in.Digest(), "host"};
  req.model = "m";
  req.inputs = in;
  req.bytes = 1 << 20;
  req.load = [backend](cache::Entry&) -> absl::StatusOr<std::unique_ptr<load::LoadedModel>> {
    auto out = std::make_unique<load::LoadedModel>();
    auto seg = backend->Allocate("", 1 << 20, "keeper link test");
    if (!seg.ok()) return seg.status();
    out->segments.push_back(std::move(seg).value());
    out->device_uuid = "host";
    out->plan.segment_bytes = {1 << 20};
    out->plan.total_bytes = 1 << 20;
    return out;
  };
  return req;
}

v1::KeeperStatus StatusOf(const KeeperLink& link) {
  v1::KeeperStatus st;
  link.Fill(&st);
  return st;
}

// The load's thread held past io_timeout after BeforeReady: the link's mark for the entry
// stays pending until the entry is ready, and the entry is deposited. (Before, the mark was
// taken as done when the wait for ready timed out: the entry was never deposited, so a
// restart could not adopt it, and its eviction found nothing to drop, leaving a frozen
// keeper unnoticed: the busy-CI flake of keeper_integration_test.)
TEST(KeeperLinkTest, AnEntrySlowToTurnReadyIsStillDeposited) {
  testing::TempDir dir;
  keeper::KeeperOptions ko;
  ko.socket_path = dir.path() + "/k/keeper.sock";
  auto keeper = keeper::Keeper::Start(ko);
  ASSERT_TRUE(keeper.ok()) << keeper.status();
  auto backend = memory::MakeHostBackend();
  cache::Registry registry;
  registry.SetDigester(
      [](const cache::Entry&,
         const load::LoadedModel& m) -> absl::StatusOr<std::vector<integrity::SegmentDigest>> {
        std::vector<integrity::SegmentDigest> out;
        for (const auto& s : m.segments) {
          out.push_back({{0}, integrity::CryptoDigestHost(s->host_data(), s->size())});
        }
        return out;
      });
  KeeperLink::Options o;
  o.socket_path = ko.socket_path;
  o.retry = milliseconds(20);
  o.io_timeout = milliseconds(100);
  KeeperLink link(o, backend.get(), &registry, nullptr, [](const std::string&) {
    return RecordedSpec{"name: m\n", true};
  });
  EXPECT_EQ(link.AdoptAll([](const v1::KeeperRecord&) { return absl::OkStatus(); }), 0u);
  SlowToReady slow(&link, 10 * o.io_timeout);
  registry.SetObserver(&slow);
  link.StartWatch();

  auto e = registry.StartOrJoin(OneSegmentLoad(backend.get()));
  ASSERT_TRUE(e.ok()) << e.status();
  ASSERT_TRUE(
      registry.WaitReady(*e, std::chrono::steady_clock::now() + std::chrono::seconds(30)).ok());
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (std::chrono::steady_clock::now() < deadline &&
         (StatusOf(link).deposits() == 0 || StatusOf(link).pending_entries() != 0)) {
    std::this_thread::sleep_for(milliseconds(5));  // a condition, with a deadline
  }
  const v1::KeeperStatus st = StatusOf(link);
  EXPECT_EQ(st.deposits(), 1u) << st.DebugString();
  EXPECT_EQ(st.pending_entries(), 0u);
  EXPECT_EQ((*keeper)->stats().entries, 1u);

  // Its eviction is a drop the keeper sees.
  EXPECT_EQ(registry.Evict((*e)->key, "test"), cache::Registry::Evicted::kGone);
  const auto dropped = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (std::chrono::steady_clock::now() < dropped && (*keeper)->stats().entries != 0) {
    std::this_thread::sleep_for(milliseconds(5));  // a condition, with a deadline
  }
  EXPECT_EQ((*keeper)->stats().entries, 0u);
  link.Stop();
  registry.SetObserver(nullptr);
}

}  // namespace
}  // namespace weightcache::server
