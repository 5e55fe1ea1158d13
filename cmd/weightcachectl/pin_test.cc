// `weightcachectl pin` on Status answers made by hand (pin.h): the segment digests it prints
// are those of entries this node loaded from its own disk, never of a copy filled from peers
// (a pin of that would launder a forged copy into the fleet's anchor: issue 57, finding 3).
#include "cmd/weightcachectl/pin.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace weightcache::ctl {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

const std::string kFileDigest(64, 'a');

v1::StatusResponse WithModel() {
  v1::StatusResponse st;
  auto* m = st.add_models();
  m->set_name("m");
  auto* f = m->add_files();
  f->set_name("model.safetensors");
  f->set_digest("sha256:" + kFileDigest);
  f->set_source("computed");
  return st;
}

void AddEntry(v1::StatusResponse* st, const std::string& fp, const std::string& source,
              uint32_t rank, const std::string& digest) {
  auto* e = st->add_entries();
  e->set_model("m");
  e->set_fingerprint(fp);
  e->set_state("ready");
  e->set_source(source);
  e->mutable_layout()->set_tp_size(2);
  e->mutable_layout()->set_tp_rank(rank);
  e->add_segment_sha256(digest);
}

// Attack: a forged copy reached this node through a peer fill (a lying holder under
// --peer_trust=single); the operator runs `pin` here and pastes the block into the fleet's
// specs. Before: the peer-filled entry's digests were printed like any other, and every node
// then took the forged bytes as anchored. Answer: refused, naming why and where to pin.
TEST(LaunderPin, APeerFilledEntryIsRefusedNamingWhy) {
  v1::StatusResponse st = WithModel();
  AddEntry(&st, "wc1-forged", "peer_fill", 0, std::string(64, 'f'));
  auto block = PinBlock(st, "m");
  ASSERT_FALSE(block.ok());
  EXPECT_EQ(block.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(block.status().message()),
              HasSubstr("no entry here was loaded from this node's disk"));
  EXPECT_THAT(std::string(block.status().message()),
              HasSubstr("wc1-forged (tp 0/2): filled from other nodes' daemons (source "
                        "peer_fill): its digests are what their records said"));
  EXPECT_THAT(std::string(block.status().message()), Not(HasSubstr(std::string(64, 'f'))));
}

// Beside an entry loaded from disk, the other is left out, named, and the block says what
// its digests are.
TEST(LaunderPin, OnlyEntriesLoadedFromDiskArePrintedAndTheBlockSaysSo) {
  v1::StatusResponse st = WithModel();
  AddEntry(&st, "wc1-disk", "disk", 0, std::string(64, 'd'));
  AddEntry(&st, "wc1-forged", "peer_fill", 1, std::string(64, 'f'));
  AddEntry(&st, "wc1-kept", "keeper", 1, std::string(64, 'k'));
  auto block = PinBlock(st, "m");
  ASSERT_TRUE(block.ok()) << block.status();
  EXPECT_THAT(*block, HasSubstr("  model.safetensors: " + kFileDigest + "\n"));
  EXPECT_THAT(*block, HasSubstr("this node loaded from its own disk"));
  EXPECT_THAT(*block, HasSubstr("segment_digests:\n  wc1-disk:  # tp 0/2 on host\n    - " +
                                std::string(64, 'd') + "\n"));
  EXPECT_THAT(*block, Not(HasSubstr(std::string(64, 'f'))));
  EXPECT_THAT(*block, Not(HasSubstr(std::string(64, 'k'))));
  EXPECT_THAT(*block, HasSubstr("# left out: wc1-forged (tp 1/2): filled from other nodes'"));
  EXPECT_THAT(*block, HasSubstr("# left out: wc1-kept (tp 1/2): adopted from the keeper"));
}

// Nothing ready yet: the files' digests alone, as before.
TEST(LaunderPin, WithoutEntriesTheFilesDigestsAlone) {
  auto block = PinBlock(WithModel(), "m");
  ASSERT_TRUE(block.ok()) << block.status();
  EXPECT_THAT(*block, HasSubstr("digests:\n  model.safetensors: " + kFileDigest + "\n"));
  EXPECT_THAT(*block, Not(HasSubstr("segment_digests")));
}

}  // namespace
}  // namespace weightcache::ctl
