// GPU (label gpu; skips without a device): every byte of a cuda-vmm segment is the daemon's.
// cuMemCreate promises nothing about what fresh memory holds, so a segment's alignment gaps
// and its tail up to the granule are zeroed by the backend (one memset per segment); then a
// model loaded into memory another model has just released digests as it did the first time.
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "pkg/integrity/segment_digest.h"
#include "pkg/load/loader.h"
#include "pkg/load/model.h"
#include "pkg/load/plan.h"
#include "pkg/memory/cuda_backend.h"
#include "pkg/safetensors/writer.h"
#include "tests/testutil/temp_dir.h"

namespace weightcache::load {
namespace {

spec::ModelSpec SpecFor(const std::string& name, const std::string& dir) {
  spec::ModelSpec s;
  s.name = name;
  s.model_dir = dir;
  return s;
}

// Loads `dir` onto the backend's first device and returns the digests of its segments.
std::vector<integrity::SegmentDigest> LoadAndDigest(memory::Backend& backend,
                                                    const std::string& dir,
                                                    std::unique_ptr<LoadedModel>* keep) {
  auto m = OpenModel(SpecFor("m", dir));
  EXPECT_TRUE(m.ok()) << m.status();
  if (!m.ok()) return {};
  auto plan = PlanRank(
      **m, {},
      {.alignment = backend.tensor_alignment(), .max_segment_bytes = backend.max_segment_bytes()});
  EXPECT_TRUE(plan.ok()) << plan.status();
  if (!plan.ok()) return {};
  auto loaded = LoadRank(**m, *plan, backend, "", "tails", {}, nullptr);
  EXPECT_TRUE(loaded.ok()) << loaded.status();
  if (!loaded.ok()) return {};
  std::vector<integrity::SegmentDigest> out;
  for (const auto& s : (*loaded)->segments) {
    auto d = integrity::DigestSegment(backend.kind(), *s, {}, integrity::Want::kScrubAndCrypto);
    EXPECT_TRUE(d.ok()) << d.status();
    if (d.ok()) out.push_back(*d);
  }
  if (keep != nullptr) *keep = std::move(loaded).value();
  return out;
}

TEST(TailsZeroGpu, ALoadAfterAnotherModelsEvictionDigestsAsTheFirstLoadAndAsTheHostBackend) {
  auto backend = memory::MakeCudaBackend();
  if (!backend.ok()) GTEST_SKIP() << "no GPU (no cuda-vmm backend): " << backend.status().message();
  testing::TempDir dir_a, dir_b;
  // A: tensors of 144 bytes (hidden 72) leave gaps at 256-byte alignment, and every segment
  // has a tail up to the granule.
  safetensors::LlamaShape a = safetensors::TinyLlama();
  a.hidden = 72;
  ASSERT_TRUE(safetensors::WriteLlamaCheckpoint(dir_a.path(), a).ok());
  // B: larger and dense (seeded random values everywhere), so the memory it releases holds
  // non-zero bytes where A's gaps and tail fall when A is loaded again.
  safetensors::LlamaShape b;
  b.layers = 4;
  b.hidden = 1024;
  b.intermediate = 2816;
  b.vocab = 16384;
  b.seed = 7;
  ASSERT_TRUE(safetensors::WriteLlamaCheckpoint(dir_b.path(), b).ok());

  const auto first = LoadAndDigest(**backend, dir_a.path(), nullptr);  // load, then evict
  ASSERT_FALSE(first.empty());
  ASSERT_FALSE(LoadAndDigest(**backend, dir_b.path(), nullptr).empty());  // another model
  const auto again = LoadAndDigest(**backend, dir_a.path(), nullptr);     // the first again
  ASSERT_EQ(again.size(), first.size());
  for (size_t i = 0; i < first.size(); ++i) {
    EXPECT_TRUE(again[i] == first[i]) << "segment " << i << " digests differ after reuse";
  }
  // Another node's copy (here: the host backend, whose memfds are zero-filled) of the same
  // plan digests the same where the segment sizes agree (both granules are 2 MiB on H100/H200).
  auto host = memory::MakeHostBackend();
  if (host->granularity() == (*backend)->granularity() &&
      host->max_segment_bytes() == (*backend)->max_segment_bytes()) {
    const auto on_host = LoadAndDigest(*host, dir_a.path(), nullptr);
    ASSERT_EQ(on_host.size(), first.size());
    for (size_t i = 0; i < first.size(); ++i) {
      EXPECT_TRUE(on_host[i] == first[i]) << "segment " << i << " differs from the host copy";
    }
  }
}

}  // namespace
}  // namespace weightcache::load
