// The GPU load path (pinned staging ring, O_DIRECT spans or the page cache, strided
// tensor-parallel pieces) must put exactly the bytes the host path puts: each tensor of a
// cuda-vmm load is mapped read-only, copied back and compared with a host-backend load of
// the same plan. The cases share one staging pool, as loads in the daemon do: from the second
// on, the ring is the previous load's pinned buffers (stale bytes in them must not leak into
// the next model). Label gpu; skips without a usable GPU.
#include <unistd.h>

#include <cstring>
#include <filesystem>

#include "gtest/gtest.h"
#include "pkg/load/loader.h"
#include "pkg/load/model.h"
#include "pkg/load/plan.h"
#include "pkg/load/staging_pool.h"
#include "pkg/memory/backend.h"
#include "pkg/memory/cuda_backend.h"
#include "pkg/memory/mapping.h"
#include "pkg/safetensors/writer.h"
#include "tests/testutil/temp_dir.h"

namespace weightcache {
namespace {

struct Case {
  load::DirectIo io;
  int tp_size;
  int tp_rank;
};

// Every tensor of `gpu` (mapped read-only, copied back) equals the same tensor of `host`.
void ExpectSameBytes(const load::LoadedModel& gpu, const load::LoadedModel& host) {
  std::vector<ScopedFd> fds;
  std::vector<uint64_t> sizes;
  for (const auto& seg : gpu.segments) {
    fds.emplace_back(::dup(seg->fd()));
    sizes.push_back(seg->size());
  }
  auto map =
      memory::MapReadOnly(memory::BackendKind::kCudaVmm, std::move(fds), sizes, gpu.device_uuid);
  ASSERT_TRUE(map.ok()) << map.status();
  std::vector<uint8_t> got, expected;
  size_t checked = 0;
  for (const auto& t : gpu.plan.tensors) {
    got.resize(t.nbytes);
    expected.resize(t.nbytes);
    ASSERT_TRUE(memory::CopyToHost(memory::BackendKind::kCudaVmm, gpu.device_uuid,
                                   (*map)->base(t.segment) + t.offset, t.nbytes, got.data())
                    .ok());
    ASSERT_EQ(::pread(host.segments[t.segment]->fd(), expected.data(), t.nbytes,
                      static_cast<off_t>(t.offset)),
              static_cast<ssize_t>(t.nbytes));
    ASSERT_EQ(std::memcmp(got.data(), expected.data(), t.nbytes), 0) << t.name;
    ++checked;
  }
  EXPECT_EQ(checked, host.plan.tensors.size());
}

// A Llama checkpoint on disk (not tmpfs) so that O_DIRECT is really used; /var/tmp is
// usually the root disk. Headers of odd lengths: tensors start off 4 KiB boundaries.
std::string WriteCheckpoint() {
  std::string base = ::access("/var/tmp", W_OK) == 0 ? "/var/tmp" : "/tmp";
  std::string tmpl = base + "/wc-gpuload.XXXXXX";
  EXPECT_NE(::mkdtemp(tmpl.data()), nullptr);
  safetensors::LlamaShape shape;
  shape.layers = 3;
  shape.hidden = 1024;
  shape.intermediate = 2816;
  shape.heads = 8;
  shape.kv_heads = 4;
  shape.vocab = 4000;
  shape.shards = 3;
  EXPECT_TRUE(safetensors::WriteLlamaCheckpoint(tmpl, shape).ok());
  return tmpl;
}

TEST(GpuLoad, StagingRingPathsLoadTheSameBytesAsTheHostPath) {
  auto cuda = memory::MakeCudaBackend();
  if (!cuda.ok()) GTEST_SKIP() << "no usable GPU: " << cuda.status().message();
  const std::string dir = WriteCheckpoint();
  spec::ModelSpec s;
  s.name = "gpuload";
  s.model_dir = dir;
  auto model = load::OpenModel(s);
  ASSERT_TRUE(model.ok()) << model.status();
  auto host = memory::MakeHostBackend();
  auto pool = load::MakePinnedStagingPool(8 << 20);

  bool first = true;
  for (const Case& c : {Case{load::DirectIo::kOff, 1, 0}, Case{load::DirectIo::kOn, 1, 0},
                        Case{load::DirectIo::kOn, 2, 1}, Case{load::DirectIo::kAuto, 2, 0}}) {
    SCOPED_TRACE(::testing::Message() << "direct_io " << static_cast<int>(c.io) << " tp "
                                      << c.tp_rank << "/" << c.tp_size);
    load::PlanOptions po;
    po.loader_reads_pieces = true;
    po.max_segment_bytes = 16 << 20;  // several segments
    auto plan = load::PlanRank(**model, {c.tp_size, c.tp_rank, 1, 0}, po);
    ASSERT_TRUE(plan.ok()) << plan.status();
    load::LoadOptions lo;
    lo.direct_io = c.io;
    lo.staging_bytes = 8 << 20;  // many trips round a small ring
    lo.staging_buffers = 4;
    lo.staging_pool = pool.get();
    auto gpu = load::LoadRank(**model, *plan, **cuda, "", "gpuload", lo, nullptr);
    ASSERT_TRUE(gpu.ok()) << gpu.status();
    const auto& st = (*gpu)->stats;
    std::printf(
        "direct_io %d tp %d/%d: %u of %u files with O_DIRECT, %.3f s, staging %.4f s (%u of %u "
        "buffers reused)\n",
        static_cast<int>(c.io), c.tp_rank, c.tp_size, st.direct_files, st.files, st.seconds,
        st.staging_seconds, st.staging_reused, st.staging_buffers);
    EXPECT_EQ(st.staging_buffers, 4u);
    EXPECT_EQ(st.staging_reused, first ? 0u : 4u) << "the pool's buffers were not reused";
    first = false;
    auto want = load::LoadRank(**model, *plan, *host, "", "gpuload-host", {}, nullptr);
    ASSERT_TRUE(want.ok()) << want.status();

    ExpectSameBytes(**gpu, **want);
  }
  EXPECT_EQ(pool->counters().allocations, 4u);
  EXPECT_EQ(pool->counters().taken_bytes, 0u);
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

// A tensor-parallel group on one GPU read once (LoadRanks): every rank's bytes equal its
// own host-path load, bf16 and online fp8 (the kernel equals the CPU quantizer bit for
// bit), through O_DIRECT and the page cache, with a small ring so that buffer boundaries
// cut the row-parallel shards' 2-D copies.
TEST(GpuLoad, TensorParallelGroupOnOneGpuEqualsEachRanksHostLoad) {
  auto cuda = memory::MakeCudaBackend();
  if (!cuda.ok()) GTEST_SKIP() << "no usable GPU: " << cuda.status().message();
  const std::string dir = WriteCheckpoint();
  auto host = memory::MakeHostBackend();
  for (const char* quant : {"none", "fp8_block"}) {
    for (int tp : {2, 4}) {
      for (load::DirectIo io : {load::DirectIo::kOn, load::DirectIo::kOff}) {
        SCOPED_TRACE(::testing::Message()
                     << quant << " tp " << tp << " direct_io " << static_cast<int>(io));
        spec::ModelSpec s;
        s.name = "gpugroup";
        s.model_dir = dir;
        s.tp_size = tp;
        s.quantization = quant;
        auto model = load::OpenModel(s);
        ASSERT_TRUE(model.ok()) << model.status();
        load::PlanOptions po;
        po.loader_reads_pieces = true;
        po.max_segment_bytes = 8 << 20;
        std::vector<load::Plan> plans;
        for (int r = 0; r < tp; ++r) {
          auto plan = load::PlanRank(**model, {tp, r, 1, 0}, po);
          ASSERT_TRUE(plan.ok()) << plan.status();
          plans.push_back(*plan);
        }
        load::LoadOptions lo;
        lo.direct_io = io;
        lo.staging_bytes = 4 << 20;
        auto group = load::LoadRanks(**model, plans, **cuda, std::vector<std::string>(tp),
                                     std::vector<std::string>(tp, "gpugroup"), lo, nullptr);
        ASSERT_TRUE(group.ok()) << group.status();
        uint64_t file_bytes = 0;
        for (const auto& t : (*model)->checkpoint.tensors()) file_bytes += t.nbytes;
        // Read once (O_DIRECT rounds spans out to 4 KiB blocks).
        EXPECT_GE((*group)[0]->stats.bytes_read, file_bytes);
        EXPECT_LT((*group)[0]->stats.bytes_read, file_bytes + file_bytes / 8);
        std::printf("%s tp %d direct_io %d: group %.3f s, read %llu of %llu bytes\n", quant, tp,
                    static_cast<int>(io), (*group)[0]->stats.seconds,
                    static_cast<unsigned long long>((*group)[0]->stats.bytes_read),
                    static_cast<unsigned long long>(file_bytes));
        for (int r = 0; r < tp; ++r) {
          SCOPED_TRACE(::testing::Message() << "rank " << r);
          auto want = load::LoadRank(**model, plans[static_cast<size_t>(r)], *host, "",
                                     "gpugroup-host", {}, nullptr);
          ASSERT_TRUE(want.ok()) << want.status();
          ExpectSameBytes(*(*group)[static_cast<size_t>(r)], **want);
        }
      }
    }
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

// The rest of a peer fill (admission.cc): the part of a plan that lands in some segments
// (load::PlanSegments, widened for a weight whose scale sits in the next segment), loaded into
// cuda-vmm segments, equals the same part loaded on the host path (which load_test holds equal
// to the whole plan's segments), online fp8 and bf16, and reads fewer bytes than the whole.
TEST(GpuLoad, APartOfAPlanLoadsTheSameBytesAsOnTheHostPath) {
  auto cuda = memory::MakeCudaBackend();
  if (!cuda.ok()) GTEST_SKIP() << "no usable GPU: " << cuda.status().message();
  const std::string dir = WriteCheckpoint();
  auto host = memory::MakeHostBackend();
  for (const char* quant : {"none", "fp8_block"}) {
    SCOPED_TRACE(quant);
    spec::ModelSpec s;
    s.name = "gpupart";
    s.model_dir = dir;
    s.quantization = quant;
    auto model = load::OpenModel(s);
    ASSERT_TRUE(model.ok()) << model.status();
    load::PlanOptions po;
    po.loader_reads_pieces = true;
    po.max_segment_bytes = 1 << 20;  // projections alone in theirs, fp8 scales in the next
    auto plan = load::PlanRank(**model, {1, 0, 1, 0}, po);
    ASSERT_TRUE(plan.ok()) << plan.status();
    std::vector<bool> wanted(plan->segment_bytes.size(), false);
    for (size_t i = 0; i < wanted.size(); i += 2) wanted[i] = true;  // every other one
    const load::PlanPart part = load::PlanSegments(*plan, wanted);
    ASSERT_FALSE(part.plan.tensors.empty());
    ASSERT_LT(part.segments.size(), plan->segment_bytes.size());
    load::LoadOptions lo;
    lo.staging_bytes = 4 << 20;
    auto gpu = load::LoadRank(**model, part.plan, **cuda, "", "gpupart", lo, nullptr);
    ASSERT_TRUE(gpu.ok()) << gpu.status();
    auto want = load::LoadRank(**model, part.plan, *host, "", "gpupart-host", {}, nullptr);
    ASSERT_TRUE(want.ok()) << want.status();
    ExpectSameBytes(**gpu, **want);
    uint64_t file_bytes = 0;
    for (const auto& t : (*model)->checkpoint.tensors()) file_bytes += t.nbytes;
    EXPECT_LT((*gpu)->stats.bytes_read, file_bytes);
    std::printf("%s: %zu of %zu segments, read %llu of %llu checkpoint bytes\n", quant,
                part.segments.size(), plan->segment_bytes.size(),
                static_cast<unsigned long long>((*gpu)->stats.bytes_read),
                static_cast<unsigned long long>(file_bytes));
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

}  // namespace
}  // namespace weightcache
