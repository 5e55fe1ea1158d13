// Multi-device placement and the peer policy on the host backend: one real
// weightcached process whose host backend has two fake devices
// (--host_devices=host-a,host-b; real memfds), a tp_size 2 model, and this
// process as the engine. The same logic the 2-GPU test
// (tests/gpu/multi_gpu_test.cc) runs on two H200s, here in CI without a GPU.
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

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
using testing::Process;
using testing::TempDir;

safetensors::LlamaShape Small() { return testing::SmallLlama(); }

class MultiDeviceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(safetensors::WriteLlamaCheckpoint(dir_ / "tiny", Small()).ok());
    socket_dir_ = dir_ / "s";
  }

  // A daemon with two fake devices preloading `tiny` at tp_size 2; waits until
  // both ranks are ready.
  void StartDaemon(const std::string &policy) {
    std::vector<std::string> argv{WEIGHTCACHED_PATH,
                                  "--socket_dir=" + socket_dir_,
                                  "--backend=host",
                                  "--host_devices=host-a,host-b",
                                  "--metrics_address=off",
                                  "--peer_policy=" + policy,
                                  "--model=name=tiny,model_dir=" + (dir_ / "tiny") + ",tp_size=2"};
    auto d = testing::StartDaemon(
        argv, socket_dir_, dir_ / "daemon.log", [](const v1::StatusResponse &st) {
          return st.entries_size() == 2 && st.entries(0).state() == "ready" &&
                 st.entries(1).state() == "ready";
        });
    ASSERT_TRUE(d.ok()) << d.status();
    daemon_ = std::move(d->process);
    client_ = std::move(d->client);
  }

  std::string Log() const { return testing::ReadFileOrEmpty(dir_ / "daemon.log"); }

  absl::StatusOr<std::unique_ptr<client::Lease>> Acquire(int rank, const std::string &device) {
    client::AcquireOptions o;
    o.model = "tiny";
    o.tp_size = 2;
    o.tp_rank = rank;
    o.device_uuid = device;
    return client_->Acquire(o);
  }

  v1::StatusResponse Status() {
    auto st = client_->Status();
    EXPECT_TRUE(st.ok()) << st.status();
    return st.ok() ? *st : v1::StatusResponse{};
  }

  // The entries of rank `rank`, by device.
  static std::map<std::string, v1::EntryInfo> RankEntries(const v1::StatusResponse &st, int rank) {
    std::map<std::string, v1::EntryInfo> out;
    for (const auto &e : st.entries()) {
      if (static_cast<int>(e.layout().tp_rank()) == rank) out[e.device_uuid()] = e;
    }
    return out;
  }

  // Every tensor of `b` has the bytes of the same tensor in `a`.
  static void ExpectSameBytes(const client::Lease &a, const client::Lease &b) {
    ASSERT_EQ(a.tensors().size(), b.tensors().size());
    ASSERT_FALSE(a.tensors().empty());
    for (const auto &t : a.tensors()) {
      const auto *u = b.Find(t.name);
      ASSERT_NE(u, nullptr) << t.name;
      ASSERT_EQ(u->nbytes, t.nbytes) << t.name;
      EXPECT_EQ(std::memcmp(u->data, t.data, t.nbytes), 0) << t.name;
    }
  }

  TempDir dir_;
  std::string socket_dir_;
  std::unique_ptr<Process> daemon_;
  std::unique_ptr<client::Client> client_;
};

TEST_F(MultiDeviceTest, RanksArePlacedOnePerDeviceAndStatusShowsResidency) {
  StartDaemon("copy");
  auto st = Status();
  auto r0 = RankEntries(st, 0);
  auto r1 = RankEntries(st, 1);
  ASSERT_EQ(r0.size(), 1u);
  ASSERT_EQ(r1.size(), 1u);
  EXPECT_EQ(r0.begin()->first, "host-a");  // rank r on the r-th device
  EXPECT_EQ(r1.begin()->first, "host-b");
  EXPECT_EQ(r0.begin()->second.source(), "disk");
  // Both ranks came from one pass over the files, on two devices: each byte read once.
  auto ckpt = safetensors::Checkpoint::Open(dir_ / "tiny");
  ASSERT_TRUE(ckpt.ok());
  uint64_t file_bytes = 0;
  for (const auto &t : ckpt->tensors()) file_bytes += t.nbytes;
  EXPECT_EQ(r0.begin()->second.bytes_read(), file_bytes);
  EXPECT_EQ(r1.begin()->second.bytes_read(), file_bytes);
  ASSERT_EQ(st.devices_size(), 2);
  EXPECT_EQ(st.devices(0).device_uuid(), "host-a");
  EXPECT_EQ(st.devices(0).entries(), 1u);
  EXPECT_EQ(st.devices(0).cache_bytes(), r0.begin()->second.bytes());
  EXPECT_EQ(st.devices(1).device_uuid(), "host-b");
  EXPECT_EQ(st.devices(1).entries(), 1u);
  EXPECT_EQ(st.devices(1).cache_bytes(), r1.begin()->second.bytes());

  // A request naming a device is served from that device; the manifest says
  // which.
  auto l1 = Acquire(1, "host-b");
  ASSERT_TRUE(l1.ok()) << l1.status();
  EXPECT_EQ((*l1)->device_uuid(), "host-b");
  EXPECT_EQ((*l1)->fingerprint(), r1.begin()->second.fingerprint());
  // No device named: whichever device holds it.
  auto l0 = Acquire(0, "");
  ASSERT_TRUE(l0.ok()) << l0.status();
  EXPECT_EQ((*l0)->device_uuid(), "host-a");
  // A device the daemon does not have: refused, naming the devices it has.
  auto bad = Acquire(0, "GPU-nope");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("host-b"), absl::string_view::npos) << bad.status();
  st = Status();
  EXPECT_EQ(st.acquire_hits(), 2u);
  EXPECT_EQ(st.acquire_peer_copies(), 0u);
}

TEST_F(MultiDeviceTest, CopyPolicyServesAnotherDevicesRankByAPeerCopy) {
  StartDaemon("copy");
  auto on_a = Acquire(0, "host-a");
  ASSERT_TRUE(on_a.ok()) << on_a.status();
  auto on_b = Acquire(0, "host-b");  // rank 0 lives on host-a only
  ASSERT_TRUE(on_b.ok()) << on_b.status();
  EXPECT_EQ((*on_b)->device_uuid(), "host-b");
  EXPECT_EQ((*on_b)->fingerprint(), (*on_a)->fingerprint());
  ExpectSameBytes(**on_a, **on_b);
  EXPECT_NE((*on_b)->segment_base(0),
            (*on_a)->segment_base(0));  // its own memory

  auto st = Status();
  EXPECT_EQ(st.acquire_peer_copies(), 1u);
  EXPECT_EQ(st.acquire_hits(), 1u);
  auto r0 = RankEntries(st, 0);
  ASSERT_EQ(r0.size(), 2u);  // same rank, two devices, two entries
  EXPECT_EQ(r0["host-a"].source(), "disk");
  EXPECT_EQ(r0["host-b"].source(), "peer");
  EXPECT_EQ(r0["host-b"].fingerprint(), r0["host-a"].fingerprint());
  EXPECT_EQ(r0["host-b"].state(), "ready");
  EXPECT_EQ(st.devices(1).entries(),
            2u);  // host-b: rank 1 and the copy of rank 0
  EXPECT_EQ(st.devices(1).cache_bytes(),
            r0["host-b"].bytes() + RankEntries(st, 1)["host-b"].bytes());
  EXPECT_NE(Log().find("route peer"), std::string::npos) << Log();

  // The copy is now an entry like any other: the next request for it is a hit.
  auto again = Acquire(0, "host-b");
  ASSERT_TRUE(again.ok()) << again.status();
  st = Status();
  EXPECT_EQ(st.acquire_peer_copies(), 1u);
  EXPECT_EQ(st.acquire_hits(), 2u);

  // Evicting the model drops every device's entries.
  on_a->reset();
  on_b->reset();
  again->reset();
  ASSERT_TRUE(testing::AdminClient(socket_dir_)->Evict("tiny", "").ok());  // the operator
  // Entries whose leases the daemon has not yet seen end are draining until it does.
  testing::WaitForStatus(
      *client_, [](const v1::StatusResponse &s) { return s.entries_size() == 0; },
      std::chrono::seconds(5));
}

TEST_F(MultiDeviceTest, HostPolicyStagesThroughHostMemory) {
  StartDaemon("host");
  auto on_b = Acquire(0, "host-b");
  ASSERT_TRUE(on_b.ok()) << on_b.status();
  auto on_a = Acquire(0, "host-a");
  ASSERT_TRUE(on_a.ok()) << on_a.status();
  ExpectSameBytes(**on_a, **on_b);
  auto st = Status();
  EXPECT_EQ(st.acquire_peer_copies(), 1u);
  EXPECT_NE(Log().find("route host"), std::string::npos) << Log();
  EXPECT_EQ(Log().find("route peer"), std::string::npos) << Log();
}

TEST_F(MultiDeviceTest, MissPolicyAnswersNotFoundNamingTheHoldingDevice) {
  StartDaemon("miss");
  auto on_b = Acquire(0, "host-b");
  EXPECT_EQ(on_b.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(on_b.status().message().find("cached on host-a"), absl::string_view::npos)
      << on_b.status();
  EXPECT_NE(on_b.status().message().find("peer_policy is miss"), absl::string_view::npos);
  auto st = Status();
  EXPECT_EQ(st.acquire_misses(), 1u);
  EXPECT_EQ(st.acquire_peer_copies(), 0u);
  EXPECT_EQ(st.entries_size(), 2);  // nothing copied
}

}  // namespace
}  // namespace weightcache
