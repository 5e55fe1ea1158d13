// Sleep and wake through the C++ client on the host backend, with a real weightcached process:
// Lease::Detach lets go of the memory and the lease (the entry evictable, and evicted by an
// admin Evict or by the budget), keeping every tensor's address reserved PROT_NONE;
// Lease::Reattach maps the same fingerprint at the same addresses (bytes equal) and refuses,
// naming both, a fingerprint that changed meanwhile.
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "pkg/client/client.h"
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
using testing::TempDir;

// The /proc/self/maps line of the mapping holding `p` ("" when none does).
std::string MapsLineOf(const void* p) {
  std::ifstream maps("/proc/self/maps");
  const auto at = reinterpret_cast<uintptr_t>(p);
  for (std::string line; std::getline(maps, line);) {
    unsigned long lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx", &lo, &hi) == 2 && lo <= at && at < hi) return line;
  }
  return "";
}

// Every tensor's address and bytes.
struct Snapshot {
  std::map<std::string, const void*> addresses;
  std::map<std::string, std::string> bytes;
};
Snapshot Take(const client::Lease& l) {
  Snapshot s;
  for (const auto& t : l.tensors()) {
    s.addresses[t.name] = t.data;
    s.bytes[t.name] = std::string(static_cast<const char*>(t.data), t.nbytes);
  }
  return s;
}

class DetachTest : public ::testing::Test {
 protected:
  void Write(const std::string& name, uint64_t seed) {
    auto shape = safetensors::TinyLlama();  // ~100 KB: one 2 MiB segment
    shape.seed = seed;
    ASSERT_TRUE(safetensors::WriteLlamaCheckpoint(dir_ / name, shape).ok());
  }

  void Start(const std::vector<std::string>& models, std::vector<std::string> extra = {}) {
    std::string yaml = "models:\n";
    for (const auto& m : models) yaml += "  - name: " + m + "\n    model_dir: " + dir_ / m + "\n";
    std::ofstream(dir_ / "specs.yaml", std::ios::trunc) << yaml;
    std::vector<std::string> argv{WEIGHTCACHED_PATH, "--socket_dir=" + socket_dir(),
                                  "--backend=host",  "--metrics_address=off",
                                  "--preload=false", "--spec_file=" + dir_ / "specs.yaml"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    auto d = testing::StartDaemon(argv, socket_dir(), dir_ / "daemon.log");
    ASSERT_TRUE(d.ok()) << d.status();
    daemon_ = std::move(d->process);
    client_ = std::move(d->client);
    admin_ = testing::AdminClient(socket_dir());
  }

  absl::StatusOr<std::unique_ptr<client::Lease>> Acquire(const std::string& model) {
    client::AcquireOptions o;
    o.model = model;
    o.wait_ready = true;
    o.load_on_miss = true;
    return client_->Acquire(o);
  }

  // The entries of `model` in the daemon's Status.
  std::vector<v1::EntryInfo> Entries(const std::string& model) {
    auto st = client_->Status();
    EXPECT_TRUE(st.ok()) << st.status();
    std::vector<v1::EntryInfo> out;
    if (!st.ok()) return out;
    for (const auto& e : st->entries()) {
      if (e.model() == model) out.push_back(e);
    }
    return out;
  }

  std::string socket_dir() const { return dir_ / "s"; }

  TempDir dir_;
  std::unique_ptr<Process> daemon_;
  std::unique_ptr<client::Client> client_;
  std::unique_ptr<client::Client> admin_;
};

TEST_F(DetachTest, DetachLetsTheEntryBeEvictedAndReattachMapsTheSameAddressesAndBytes) {
  Write("m", 11);
  Start({"m"});
  auto lease = Acquire("m");
  ASSERT_TRUE(lease.ok()) << lease.status();
  client::Lease& l = **lease;
  const Snapshot before = Take(l);
  const std::string fp = l.fingerprint(), first_id = l.id();
  const void* base = l.segment_base(0);
  ASSERT_EQ(Entries("m").size(), 1u);
  EXPECT_EQ(Entries("m")[0].lease_count(), 1u);

  ASSERT_TRUE(l.Detach().ok());
  EXPECT_TRUE(l.detached());
  EXPECT_TRUE(l.Detach().ok());  // twice: a no-op
  // Released in the daemon by the time Detach returns; the range reserved, inaccessible.
  ASSERT_EQ(Entries("m").size(), 1u);
  EXPECT_EQ(Entries("m")[0].lease_count(), 0u);
  EXPECT_EQ(l.segment_base(0), base);
  EXPECT_THAT(MapsLineOf(base), HasSubstr(" ---p ")) << MapsLineOf(base);
  const client::LeaseWatch w = l.Watch(100ms);  // never re-attaches on its own
  EXPECT_EQ(w.state, client::LeaseState::kUnknown);
  EXPECT_THAT(w.message, HasSubstr("detached"));
  EXPECT_TRUE(l.detached());

  // Woken while the entry is still resident (by fingerprint, nothing loaded), then asleep again.
  ASSERT_TRUE(l.Reattach().ok());
  EXPECT_EQ(Take(l).bytes, before.bytes);
  EXPECT_EQ(Entries("m")[0].lease_count(), 1u);
  ASSERT_TRUE(l.Detach().ok());

  // The operator evicts it: gone at once (no lease drains it).
  auto evicted = admin_->EvictDetailed("m", "");
  ASSERT_TRUE(evicted.ok()) << evicted.status();
  EXPECT_EQ(evicted->evicted(), 1u);
  EXPECT_EQ(evicted->draining(), 0u);
  EXPECT_TRUE(Entries("m").empty());

  // Re-attach: the daemon loads it again (same fingerprint), mapped where it was.
  ASSERT_TRUE(l.Reattach().ok());
  EXPECT_FALSE(l.detached());
  EXPECT_EQ(l.fingerprint(), fp);
  EXPECT_NE(l.id(), first_id);
  EXPECT_EQ(l.segment_base(0), base);
  EXPECT_THAT(MapsLineOf(base), HasSubstr(" r--s ")) << MapsLineOf(base);
  const Snapshot after = Take(l);
  EXPECT_EQ(after.addresses, before.addresses);
  EXPECT_EQ(after.bytes, before.bytes);
  ASSERT_EQ(Entries("m").size(), 1u);
  EXPECT_EQ(Entries("m")[0].lease_count(), 1u);
  EXPECT_EQ(l.Watch().state, client::LeaseState::kClean);
  EXPECT_EQ(l.Reattach().code(), absl::StatusCode::kFailedPrecondition);  // attached
}

TEST_F(DetachTest, DetachedEntryIsEvictedByTheBudgetAndReattachReloadsIt) {
  Write("a", 21);
  Write("b", 22);
  Start({"a", "b"}, {"--memory_budget=3MiB"});  // one 2 MiB entry fits, two do not
  auto a = Acquire("a");
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_EQ(Entries("a").size(), 1u);
  ASSERT_EQ(Entries("a")[0].bytes(), 2u << 20);
  const Snapshot before = Take(**a);
  // Leased, `a` holds its memory: `b` does not fit.
  EXPECT_EQ(Acquire("b").status().code(), absl::StatusCode::kResourceExhausted);

  ASSERT_TRUE((*a)->Detach().ok());
  {
    auto b = Acquire("b");  // the budget evicts the unleased `a` for it
    ASSERT_TRUE(b.ok()) << b.status();
    EXPECT_TRUE(Entries("a").empty());
    // `a`'s addresses stay reserved while another model fills its memory.
    EXPECT_THAT(MapsLineOf((*a)->segment_base(0)), HasSubstr(" ---p "));
    // Waking `a` while `b` is leased: no room; `a` stays detached.
    auto full = (*a)->Reattach();
    EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted) << full;
    EXPECT_TRUE((*a)->detached());
    ASSERT_TRUE((*b)->Detach().ok());  // `b` sleeps: its entry may go in turn
  }
  ASSERT_TRUE((*a)->Reattach().ok());
  const Snapshot after = Take(**a);
  EXPECT_EQ(after.addresses, before.addresses);
  EXPECT_EQ(after.bytes, before.bytes);
  EXPECT_TRUE(Entries("b").empty());
}

TEST_F(DetachTest, ReattachRefusesAChangedFingerprintNamingBoth) {
  Write("m", 31);
  Write("other", 32);
  Start({"m"});
  auto lease = Acquire("m");
  ASSERT_TRUE(lease.ok()) << lease.status();
  const std::string old_fp = (*lease)->fingerprint();
  const void* base = (*lease)->segment_base(0);
  ASSERT_TRUE((*lease)->Detach().ok());
  // The checkpoint of `m` is replaced meanwhile: the model name now means other weights.
  std::filesystem::rename(dir_ / "other/model.safetensors", dir_ / "m/model.safetensors");

  auto s = (*lease)->Reattach();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  ASSERT_EQ(Entries("m").size(), 1u);
  const std::string new_fp = Entries("m")[0].fingerprint();
  EXPECT_NE(new_fp, old_fp);
  EXPECT_THAT(std::string(s.message()), HasSubstr(old_fp));
  EXPECT_THAT(std::string(s.message()), HasSubstr(new_fp));
  EXPECT_THAT(std::string(s.message()), HasSubstr("now serves fingerprint"));
  // Still detached, still reserved; the new weights' lease it took was given back.
  EXPECT_TRUE((*lease)->detached());
  EXPECT_THAT(MapsLineOf(base), HasSubstr(" ---p "));
  EXPECT_EQ(Entries("m")[0].lease_count(), 0u);

  // Without a load allowed, a miss is a miss, naming both tries.
  client::Lease::ReattachOptions no_load;
  no_load.load_on_miss = false;
  ASSERT_EQ(admin_->Evict("m", "").value_or(0), 1u);
  auto miss = (*lease)->Reattach(no_load);
  EXPECT_EQ(miss.code(), absl::StatusCode::kNotFound) << miss;
  EXPECT_THAT(std::string(miss.message()), HasSubstr("by fingerprint: "));
  EXPECT_THAT(std::string(miss.message()), HasSubstr("by model name: "));
  EXPECT_TRUE((*lease)->detached());
}

}  // namespace
}  // namespace weightcache
