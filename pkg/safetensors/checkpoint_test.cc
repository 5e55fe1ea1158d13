// Checkpoint::Open: sharded and single-file directories, and every index fault.
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "pkg/safetensors/internal/test_util.h"
#include "pkg/safetensors/safetensors.h"
#include "pkg/safetensors/writer.h"
#include "tests/testutil/fifo.h"

namespace weightcache::safetensors {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using testing::TempDir;
using testing::WriteRaw;

constexpr char kIndex[] = "model.safetensors.index.json";

std::string Msg(const absl::Status& s) { return std::string(s.message()); }

nlohmann::json ReadJson(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return nlohmann::json::parse(ss.str());
}

void WriteJson(const std::string& path, const nlohmann::json& j) {
  testing::WriteBytes(path, j.dump(1));
}

LlamaShape SmallShape(int shards) {
  LlamaShape s;
  s.layers = 2;
  s.hidden = 64;
  s.intermediate = 160;
  s.heads = 4;
  s.kv_heads = 2;
  s.vocab = 256;
  s.shards = shards;
  return s;
}

std::vector<uint8_t> ReadTensor(const Checkpoint& ckpt, const TensorInfo& t) {
  std::vector<uint8_t> out(t.nbytes);
  absl::Status s = ReadRanges(
      {{ckpt.files()[t.file_index].fd(), t.file_offset, t.nbytes, out.data(), t.name}}, {});
  EXPECT_TRUE(s.ok()) << s;
  return out;
}

TEST(CheckpointTest, ShardedLlamaOpensWithEveryTensor) {
  TempDir dir;
  const LlamaShape shape = SmallShape(3);
  ASSERT_TRUE(WriteLlamaCheckpoint(dir.path(), shape).ok());
  auto ckpt = Checkpoint::Open(dir.path());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_EQ(ckpt->dir(), dir.path());

  ASSERT_EQ(ckpt->files().size(), 3u);
  EXPECT_EQ(ckpt->files()[0].info().name, "model-00001-of-00003.safetensors");
  EXPECT_EQ(ckpt->files()[2].info().name, "model-00003-of-00003.safetensors");
  for (const File& f : ckpt->files()) EXPECT_FALSE(f.tensors().empty()) << f.info().name;

  const int64_t head_dim = 64 / 4;
  const std::vector<std::pair<std::string, std::vector<int64_t>>> expected_layer = {
      {"input_layernorm.weight", {64}},
      {"self_attn.q_proj.weight", {64, 64}},
      {"self_attn.k_proj.weight", {2 * head_dim, 64}},
      {"self_attn.v_proj.weight", {2 * head_dim, 64}},
      {"self_attn.o_proj.weight", {64, 64}},
      {"post_attention_layernorm.weight", {64}},
      {"mlp.gate_proj.weight", {160, 64}},
      {"mlp.up_proj.weight", {160, 64}},
      {"mlp.down_proj.weight", {64, 160}},
  };
  std::vector<std::pair<std::string, std::vector<int64_t>>> expected = {
      {"model.embed_tokens.weight", {256, 64}},
      {"model.norm.weight", {64}},
      {"lm_head.weight", {256, 64}}};
  for (int i = 0; i < 2; ++i) {
    for (const auto& [suffix, dims] : expected_layer) {
      expected.emplace_back("model.layers." + std::to_string(i) + "." + suffix, dims);
    }
  }
  ASSERT_EQ(ckpt->tensors().size(), expected.size());
  uint64_t sum = 0;
  for (const auto& [name, dims] : expected) {
    const TensorInfo* t = ckpt->Find(name);
    ASSERT_NE(t, nullptr) << name;
    EXPECT_EQ(t->shape, dims) << name;
    EXPECT_EQ(t->dtype, DType::kBF16);
    sum += t->nbytes;
  }
  EXPECT_EQ(ckpt->Find("model.layers.2.mlp.up_proj.weight"), nullptr);
  EXPECT_EQ(ckpt->total_bytes(), sum);
  EXPECT_TRUE(
      std::is_sorted(ckpt->tensors().begin(), ckpt->tensors().end(),
                     [](const TensorInfo& a, const TensorInfo& b) { return a.name < b.name; }));

  // The index agrees with where the tensors are.
  const nlohmann::json index = ReadJson(dir.File(kIndex));
  EXPECT_EQ(index["metadata"]["total_size"].get<uint64_t>(), sum);
  for (const TensorInfo& t : ckpt->tensors()) {
    EXPECT_EQ(index["weight_map"][t.name].get<std::string>(),
              ckpt->files()[t.file_index].info().name);
  }

  const nlohmann::json config = ReadJson(dir.File("config.json"));
  EXPECT_EQ(config["architectures"][0], "LlamaForCausalLM");
  EXPECT_EQ(config["hidden_size"], 64);
  EXPECT_EQ(config["intermediate_size"], 160);
  EXPECT_EQ(config["num_attention_heads"], 4);
  EXPECT_EQ(config["num_key_value_heads"], 2);
  EXPECT_EQ(config["num_hidden_layers"], 2);
  EXPECT_EQ(config["vocab_size"], 256);
  EXPECT_EQ(config["torch_dtype"], "bfloat16");
  EXPECT_TRUE(config["rms_norm_eps"].is_number_float());
}

TEST(CheckpointTest, ValuesAreSeededFiniteAndIndependentOfSharding) {
  TempDir one, three, other_seed;
  LlamaShape shape = SmallShape(1);
  ASSERT_TRUE(WriteLlamaCheckpoint(one.path(), shape).ok());
  shape.shards = 3;
  ASSERT_TRUE(WriteLlamaCheckpoint(three.path(), shape).ok());
  shape.seed = 7;
  ASSERT_TRUE(WriteLlamaCheckpoint(other_seed.path(), shape).ok());
  auto a = Checkpoint::Open(one.path());
  auto b = Checkpoint::Open(three.path());
  auto c = Checkpoint::Open(other_seed.path());
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  ASSERT_EQ(a->files().size(), 1u);
  EXPECT_EQ(a->files()[0].info().name, "model.safetensors");
  EXPECT_EQ(a->files()[0].info().metadata.at("format"), "pt");

  for (const TensorInfo& t : a->tensors()) {
    const std::vector<uint8_t> va = ReadTensor(*a, t);
    EXPECT_EQ(va, ReadTensor(*b, *b->Find(t.name))) << t.name;
    EXPECT_NE(va, ReadTensor(*c, *c->Find(t.name))) << t.name;
    // Every BF16 value is finite and not all of them are zero.
    bool nonzero = false;
    for (size_t i = 0; i + 1 < va.size(); i += 2) {
      const uint16_t v = static_cast<uint16_t>(va[i] | (va[i + 1] << 8));
      ASSERT_NE(v & 0x7F80, 0x7F80) << t.name << " element " << i / 2;
      nonzero = nonzero || (v & 0x7FFF) != 0;
    }
    EXPECT_TRUE(nonzero) << t.name;
  }
}

TEST(CheckpointTest, DirectoryWithoutIndexTakesAllSafetensorsFiles) {
  TempDir dir;
  ASSERT_TRUE(WriteFile(dir.File("b.safetensors"), {{"y", DType::kU8, {2}, {1, 2}}}).ok());
  ASSERT_TRUE(WriteFile(dir.File("a.safetensors"), {{"x", DType::kU8, {1}, {3}}}).ok());
  testing::WriteBytes(dir.File("README.md"), "not a tensor file");
  auto ckpt = Checkpoint::Open(dir.path());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  ASSERT_EQ(ckpt->files().size(), 2u);
  EXPECT_EQ(ckpt->files()[0].info().name, "a.safetensors");
  ASSERT_NE(ckpt->Find("y"), nullptr);
  EXPECT_EQ(ckpt->Find("y")->file_index, 1u);
  EXPECT_EQ(ckpt->total_bytes(), 3u);
}

TEST(CheckpointTest, EmptyOrMissingDirectoryIsNotFound) {
  TempDir dir;
  auto empty = Checkpoint::Open(dir.path());
  EXPECT_EQ(empty.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Msg(empty.status()), HasSubstr("no *.safetensors files"));
  auto missing = Checkpoint::Open(dir.File("nope"));
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Msg(missing.status()), HasSubstr("nope"));
}

TEST(CheckpointTest, MalformedShardNamesTheShard) {
  TempDir dir;
  ASSERT_TRUE(WriteLlamaCheckpoint(dir.path(), SmallShape(2)).ok());
  testing::WriteBytes(dir.File("model-00002-of-00002.safetensors"), "\x01\x02");
  auto ckpt = Checkpoint::Open(dir.path());
  EXPECT_EQ(ckpt.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(ckpt.status()),
              AllOf(HasSubstr("model-00002-of-00002.safetensors"), HasSubstr("truncated")));
}

TEST(CheckpointTest, IndexPointsAtMissingTensor) {
  TempDir dir;
  ASSERT_TRUE(WriteLlamaCheckpoint(dir.path(), SmallShape(2)).ok());
  nlohmann::json index = ReadJson(dir.File(kIndex));
  index["weight_map"]["model.layers.9.mlp.up_proj.weight"] = "model-00001-of-00002.safetensors";
  WriteJson(dir.File(kIndex), index);
  auto ckpt = Checkpoint::Open(dir.path());
  EXPECT_EQ(ckpt.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(ckpt.status()),
              HasSubstr("model.safetensors.index.json: tensor 'model.layers.9.mlp.up_proj.weight' "
                        "is missing from shard model-00001-of-00002.safetensors (no shard has "
                        "it)"));
}

TEST(CheckpointTest, IndexPointsAtWrongShard) {
  TempDir dir;
  ASSERT_TRUE(WriteLlamaCheckpoint(dir.path(), SmallShape(2)).ok());
  nlohmann::json index = ReadJson(dir.File(kIndex));
  ASSERT_EQ(index["weight_map"]["lm_head.weight"], "model-00002-of-00002.safetensors");
  index["weight_map"]["lm_head.weight"] = "model-00001-of-00002.safetensors";
  WriteJson(dir.File(kIndex), index);
  auto ckpt = Checkpoint::Open(dir.path());
  EXPECT_EQ(ckpt.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(ckpt.status()), AllOf(HasSubstr("tensor 'lm_head.weight' is missing from shard "
                                                  "model-00001-of-00002.safetensors"),
                                        HasSubstr("it is in model-00002-of-00002.safetensors")));
}

TEST(CheckpointTest, IndexPointsAtMissingShardFile) {
  TempDir dir;
  ASSERT_TRUE(WriteLlamaCheckpoint(dir.path(), SmallShape(2)).ok());
  nlohmann::json index = ReadJson(dir.File(kIndex));
  index["weight_map"]["extra.weight"] = "model-00003-of-00003.safetensors";
  WriteJson(dir.File(kIndex), index);
  auto ckpt = Checkpoint::Open(dir.path());
  EXPECT_EQ(ckpt.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Msg(ckpt.status()),
              AllOf(HasSubstr("model.safetensors.index.json"),
                    HasSubstr("model-00003-of-00003.safetensors"), HasSubstr("No such file")));
}

TEST(CheckpointTest, ShardTensorMissingFromIndex) {
  TempDir dir;
  ASSERT_TRUE(WriteLlamaCheckpoint(dir.path(), SmallShape(2)).ok());
  nlohmann::json index = ReadJson(dir.File(kIndex));
  ASSERT_EQ(index["weight_map"].erase("model.norm.weight"), 1u);
  WriteJson(dir.File(kIndex), index);
  auto ckpt = Checkpoint::Open(dir.path());
  EXPECT_EQ(ckpt.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(ckpt.status()),
              HasSubstr("model-00002-of-00002.safetensors: tensor 'model.norm.weight' is not "
                        "listed in model.safetensors.index.json"));
}

TEST(CheckpointTest, DuplicateTensorAcrossShards) {
  TempDir dir;
  ASSERT_TRUE(WriteFile(dir.File("a.safetensors"), {{"w", DType::kU8, {1}, {1}}}).ok());
  ASSERT_TRUE(WriteFile(dir.File("b.safetensors"),
                        {{"v", DType::kU8, {1}, {2}}, {"w", DType::kU8, {1}, {3}}})
                  .ok());
  auto ckpt = Checkpoint::Open(dir.path());
  EXPECT_EQ(ckpt.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(ckpt.status()),
              HasSubstr("duplicate tensor 'w' in both a.safetensors and b.safetensors"));

  // The same with an index naming one of them.
  WriteJson(dir.File(kIndex), {{"weight_map", {{"w", "a.safetensors"}, {"v", "b.safetensors"}}}});
  ckpt = Checkpoint::Open(dir.path());
  EXPECT_EQ(ckpt.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(ckpt.status()),
              HasSubstr("duplicate tensor 'w' in both a.safetensors and b.safetensors"));
}

TEST(CheckpointTest, IndexShardNameEscapingTheDirectory) {
  TempDir dir;
  ASSERT_TRUE(WriteFile(dir.File("model.safetensors"), {{"w", DType::kU8, {1}, {1}}}).ok());
  for (const char* shard :
       {"../model.safetensors", "sub/model.safetensors", "/etc/passwd", "..", ""}) {
    WriteJson(dir.File(kIndex), {{"weight_map", {{"w", shard}}}});
    auto ckpt = Checkpoint::Open(dir.path());
    EXPECT_EQ(ckpt.status().code(), absl::StatusCode::kInvalidArgument) << shard;
    EXPECT_THAT(Msg(ckpt.status()), AllOf(HasSubstr("model.safetensors.index.json: tensor 'w'"),
                                          HasSubstr("escapes the checkpoint directory")))
        << shard;
  }
}

TEST(CheckpointTest, MalformedIndex) {
  TempDir dir;
  ASSERT_TRUE(WriteFile(dir.File("model.safetensors"), {{"w", DType::kU8, {1}, {1}}}).ok());
  testing::WriteBytes(dir.File(kIndex), "{\"weight_map\": ");
  auto ckpt = Checkpoint::Open(dir.path());
  EXPECT_EQ(ckpt.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(ckpt.status()), AllOf(HasSubstr(kIndex), HasSubstr("not valid JSON")));

  WriteJson(dir.File(kIndex), {{"metadata", {{"total_size", 1}}}});
  ckpt = Checkpoint::Open(dir.path());
  EXPECT_EQ(ckpt.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(ckpt.status()), AllOf(HasSubstr(kIndex), HasSubstr("no \"weight_map\"")));

  WriteJson(dir.File(kIndex), {{"weight_map", {{"w", 3}}}});
  ckpt = Checkpoint::Open(dir.path());
  EXPECT_EQ(ckpt.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(ckpt.status()), AllOf(HasSubstr("tensor 'w'"), HasSubstr("not a shard")));
}

// Issue 14: a FIFO among the *.safetensors files was skipped ("no *.safetensors files"), and
// a FIFO where the index or an indexed shard should be hung the open.
TEST(CheckpointTest, FifoShardWithoutIndexIsNamed) {
  TempDir dir;
  WriteRaw(dir.File("a.safetensors"), R"({"x":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})",
           1);
  ::weightcache::testing::FifoGuard fifo(dir.File("b.safetensors"));
  ASSERT_TRUE(fifo.made());
  auto ckpt = Checkpoint::Open(dir.path());
  EXPECT_EQ(ckpt.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(ckpt.status()),
              HasSubstr(dir.File("b.safetensors") + ": is a FIFO, not a regular file"));
  EXPECT_FALSE(fifo.fired()) << "Checkpoint::Open blocked on the FIFO";
}

TEST(CheckpointTest, NonRegularShardWithoutIndexIsNamed) {
  TempDir dir;
  std::filesystem::create_directory(dir.File("only.safetensors"));
  auto ckpt = Checkpoint::Open(dir.path());
  EXPECT_EQ(ckpt.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(ckpt.status()),
              HasSubstr(dir.File("only.safetensors") + ": is a directory, not a regular file"));
  std::filesystem::remove(dir.File("only.safetensors"));
  std::filesystem::create_symlink(dir.File("gone"), dir.File("dangling.safetensors"));
  ckpt = Checkpoint::Open(dir.path());
  EXPECT_EQ(ckpt.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Msg(ckpt.status()), HasSubstr("stat " + dir.File("dangling.safetensors")));
}

TEST(CheckpointTest, FifoIndexedShardIsNamed) {
  TempDir dir;
  ASSERT_TRUE(WriteLlamaCheckpoint(dir.path(), SmallShape(2)).ok());
  const std::string shard = dir.File("model-00002-of-00002.safetensors");
  std::filesystem::remove(shard);
  ::weightcache::testing::FifoGuard fifo(shard);
  ASSERT_TRUE(fifo.made());
  auto ckpt = Checkpoint::Open(dir.path());
  EXPECT_EQ(ckpt.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(ckpt.status()), HasSubstr(shard + ": is a FIFO, not a regular file"));
  EXPECT_FALSE(fifo.fired()) << "Checkpoint::Open blocked on the FIFO";
}

TEST(CheckpointTest, FifoIndexIsNamed) {
  TempDir dir;
  ASSERT_TRUE(WriteLlamaCheckpoint(dir.path(), SmallShape(2)).ok());
  std::filesystem::remove(dir.File(kIndex));
  ::weightcache::testing::FifoGuard fifo(dir.File(kIndex));
  ASSERT_TRUE(fifo.made());
  auto ckpt = Checkpoint::Open(dir.path());
  EXPECT_EQ(ckpt.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(ckpt.status()),
              HasSubstr(std::string(kIndex) + ": is a FIFO, not a regular file"));
  EXPECT_FALSE(fifo.fired()) << "Checkpoint::Open blocked on the FIFO";
}

TEST(CheckpointTest, IndexTensorNameWithControlCharacterIsRefused) {
  TempDir dir;
  ASSERT_TRUE(WriteLlamaCheckpoint(dir.path(), SmallShape(2)).ok());
  nlohmann::json index = ReadJson(dir.File(kIndex));
  index["weight_map"][std::string("lm_head.weight\0x", 16)] = "model-00001-of-00002.safetensors";
  WriteJson(dir.File(kIndex), index);
  auto ckpt = Checkpoint::Open(dir.path());
  EXPECT_EQ(ckpt.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(ckpt.status()),
              HasSubstr("model.safetensors.index.json: tensor 'lm_head.weight\\000x': name "
                        "holds control character U+0000 at byte 14"));
}

}  // namespace
}  // namespace weightcache::safetensors
