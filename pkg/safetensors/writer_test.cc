// WriteFile and WriteLlamaCheckpoint argument checks and file layout.
#include "pkg/safetensors/writer.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "pkg/safetensors/internal/test_util.h"
#include "pkg/safetensors/safetensors.h"

namespace weightcache::safetensors {
namespace {

using ::testing::HasSubstr;
using testing::TempDir;

TEST(WriteFileTest, RefusesInconsistentTensors) {
  TempDir dir;
  const std::string path = dir.File("model.safetensors");
  absl::Status s = WriteFile(path, {{"w", DType::kBF16, {2, 2}, {1, 2, 3}}});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("tensor 'w'"));
  s = WriteFile(path, {{"w", DType::kU8, {1}, {1}}, {"w", DType::kU8, {1}, {2}}});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  s = WriteFile(path, {{"w", DType::kU8, {-1}, {}}});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
}

TEST(WriteLlamaCheckpointTest, RefusesBadShapes) {
  TempDir dir;
  LlamaShape shape;
  shape.heads = 7;  // does not divide hidden = 512
  EXPECT_EQ(WriteLlamaCheckpoint(dir.path(), shape).code(), absl::StatusCode::kInvalidArgument);
  shape = {};
  shape.dtype = DType::kI32;
  EXPECT_EQ(WriteLlamaCheckpoint(dir.path(), shape).code(), absl::StatusCode::kInvalidArgument);
  shape = {};
  shape.shards = 0;
  EXPECT_EQ(WriteLlamaCheckpoint(dir.path(), shape).code(), absl::StatusCode::kInvalidArgument);
}

TEST(WriteLlamaCheckpointTest, DefaultShapeAndOtherDtypes) {
  TempDir dir;
  ASSERT_TRUE(WriteLlamaCheckpoint(dir.path(), {}).ok());
  auto ckpt = Checkpoint::Open(dir.path());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_EQ(ckpt->tensors().size(), 3u + 9u * 2u);
  EXPECT_EQ(ckpt->Find("model.layers.1.self_attn.k_proj.weight")->shape,
            (std::vector<int64_t>{256, 512}));

  for (DType dtype : {DType::kF16, DType::kF32}) {
    TempDir d;
    LlamaShape shape;
    shape.hidden = 32;
    shape.intermediate = 48;
    shape.heads = 4;
    shape.kv_heads = 1;
    shape.vocab = 64;
    shape.layers = 5;
    shape.shards = 4;
    shape.dtype = dtype;
    ASSERT_TRUE(WriteLlamaCheckpoint(d.path(), shape).ok());
    auto c = Checkpoint::Open(d.path());
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_EQ(c->files().size(), 4u);
    EXPECT_EQ(c->tensors().size(), 3u + 9u * 5u);
    EXPECT_EQ(c->Find("model.layers.4.self_attn.v_proj.weight")->shape,
              (std::vector<int64_t>{8, 32}));
    EXPECT_EQ(c->Find("lm_head.weight")->dtype, dtype);
  }
}

}  // namespace
}  // namespace weightcache::safetensors
