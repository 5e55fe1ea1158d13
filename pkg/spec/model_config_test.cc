#include "pkg/spec/model_config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "pkg/spec/fingerprint.h"
#include "tests/testutil/fifo.h"

namespace weightcache::spec {
namespace {

using ::testing::HasSubstr;

std::string Msg(const absl::Status& s) { return std::string(s.message()); }

std::string ConfigWith(const std::string& quantization_config) {
  std::string text = R"({"architectures": ["LlamaForCausalLM"], "torch_dtype": "bfloat16",
                         "hidden_size": 4096)";
  if (!quantization_config.empty()) text += ", \"quantization_config\": " + quantization_config;
  return text + "}";
}

TEST(ModelConfig, Unquantized) {
  auto c = ParseModelConfig(ConfigWith(""), "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, "LlamaForCausalLM");
  EXPECT_EQ(c->torch_dtype, "bfloat16");
  EXPECT_EQ(c->quantization.method, "none");
  EXPECT_TRUE(c->quantization.weight_block_size.empty());
  EXPECT_EQ(c->quantization.canonical_config, "");
  EXPECT_EQ(c->quantization.config_sha256, "");
  EXPECT_EQ(
      c->config_json,
      R"({"architectures":["LlamaForCausalLM"],"hidden_size":4096,"torch_dtype":"bfloat16"})");
}

TEST(ModelConfig, NullQuantizationConfigIsNone) {
  auto c = ParseModelConfig(ConfigWith("null"), "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->quantization.method, "none");
}

TEST(ModelConfig, NewerDtypeKey) {
  auto c = ParseModelConfig(R"({"architectures": ["X"], "dtype": "float16"})", "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->torch_dtype, "float16");
}

TEST(ModelConfig, BlockFp8Accepted) {
  // Keys deliberately out of order: the canonical form sorts them.
  auto c = ParseModelConfig(ConfigWith(R"({"weight_block_size": [128, 128], "quant_method": "fp8",
                                          "fmt": "e4m3", "activation_scheme": "dynamic"})"),
                            "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  const Quantization& q = c->quantization;
  EXPECT_EQ(q.method, "fp8_block");
  EXPECT_EQ(q.weight_block_size, (std::vector<int>{128, 128}));
  const std::string canonical = R"({"activation_scheme":"dynamic","fmt":"e4m3",)"
                                R"("quant_method":"fp8","weight_block_size":[128,128]})";
  EXPECT_EQ(q.canonical_config, canonical);
  EXPECT_EQ(q.config_sha256, Sha256Hex(canonical.data(), canonical.size()));
  EXPECT_EQ(q.config_sha256.size(), 64u);
}

TEST(ModelConfig, CanonicalConfigIgnoresKeyOrderAndWhitespace) {
  auto a = ParseModelConfig(
      ConfigWith(R"({"quant_method": "fp8", "weight_block_size": [128, 128]})"), "a");
  auto b = ParseModelConfig(ConfigWith(R"({ "weight_block_size":[128,128],
                      "quant_method":"fp8" })"),
                            "b");
  auto c = ParseModelConfig(
      ConfigWith(R"({"quant_method": "fp8", "weight_block_size": [64, 128]})"), "c");
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_EQ(a->quantization.config_sha256, b->quantization.config_sha256);
  EXPECT_NE(a->quantization.config_sha256, c->quantization.config_sha256);
  EXPECT_EQ(c->quantization.weight_block_size, (std::vector<int>{64, 128}));
}

struct Refused {
  std::string quantization_config;
  std::string method_text;  // what the message must name
};
void PrintTo(const Refused& r, std::ostream* os) { *os << r.quantization_config; }

class QuantizationAllowlist : public ::testing::TestWithParam<Refused> {};

TEST_P(QuantizationAllowlist, RefusedAsUnimplemented) {
  const Refused& r = GetParam();
  auto c = ParseModelConfig(ConfigWith(r.quantization_config), "/m/config.json");
  ASSERT_FALSE(c.ok()) << r.quantization_config;
  EXPECT_EQ(c.status().code(), absl::StatusCode::kUnimplemented) << c.status();
  EXPECT_THAT(Msg(c.status()), HasSubstr(r.method_text));
  EXPECT_THAT(Msg(c.status()), HasSubstr("(supported: none, fp8_block)"));
  EXPECT_THAT(Msg(c.status()), HasSubstr("/m/config.json: "));
}

INSTANTIATE_TEST_SUITE_P(
    Methods, QuantizationAllowlist,
    ::testing::Values(
        Refused{R"({"quant_method": "fp8", "activation_scheme": "static"})",
                "quantization 'fp8' with per-tensor scales"},
        Refused{R"({"quant_method": "fp8", "weight_block_size": null})",
                "quantization 'fp8' with per-tensor scales"},
        Refused{R"({"quant_method": "awq", "bits": 4, "group_size": 128})",
                "quantization 'awq' is not served"},
        Refused{R"({"quant_method": "gptq", "bits": 4})", "quantization 'gptq' is not served"},
        Refused{R"({"quant_method": "marlin"})", "quantization 'marlin' is not served"},
        Refused{R"({"quant_method": "gptq_marlin"})", "quantization 'gptq_marlin' is not served"},
        Refused{R"({"quant_method": "awq_marlin"})", "quantization 'awq_marlin' is not served"},
        Refused{R"({"quant_method": "bitsandbytes", "load_in_4bit": true})",
                "quantization 'bitsandbytes' is not served"},
        Refused{R"({"quant_method": "compressed-tensors"})",
                "quantization 'compressed-tensors' is not served"},
        Refused{R"({"quant_method": "foo"})", "quantization 'foo' is not served"},
        Refused{R"({"load_in_8bit": true})", "quantization_config without a quant_method"}),
    [](const ::testing::TestParamInfo<Refused>& info) {
      std::string name;
      for (char c : info.param.method_text)
        name += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
      return name + "_" + std::to_string(info.index);
    });

TEST(ModelConfig, AwqExactMessage) {
  auto c = ParseModelConfig(ConfigWith(R"({"quant_method": "awq"})"), "config.json");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_EQ(Msg(c.status()),
            "config.json: quantization 'awq' is not served (supported: none, fp8_block)");
}

TEST(ModelConfig, MalformedBlockSize) {
  for (std::string block : {"[128]", "[0, 128]", "[128, -1]", "[\"128\", 128]", "[128, 128, 128]",
                            "128", "[1.5, 128]"}) {
    SCOPED_TRACE(block);
    auto c = ParseModelConfig(
        ConfigWith(R"({"quant_method": "fp8", "weight_block_size": )" + block + "}"),
        "config.json");
    ASSERT_FALSE(c.ok());
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(Msg(c.status()),
                HasSubstr("config.json: quantization_config.weight_block_size: must be a list "
                          "of 2 positive integers"));
  }
}

TEST(ModelConfig, AttentionHeads) {
  auto c = ParseModelConfig(
      R"({"architectures": ["LlamaForCausalLM"], "num_attention_heads": 32,
          "num_key_value_heads": 8})",
      "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->num_attention_heads, 32);
  EXPECT_EQ(c->num_key_value_heads, 8);
  // No num_key_value_heads: multi-head attention, as transformers defaults it.
  c = ParseModelConfig(R"({"architectures": ["X"], "num_attention_heads": 12})", "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->num_key_value_heads, 12);
  c = ParseModelConfig(R"({"architectures": ["X"]})", "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->num_attention_heads, 0);
  EXPECT_EQ(c->num_key_value_heads, 0);
  for (const char* bad : {"0", "-4", "2.5", "\"8\""}) {
    c = ParseModelConfig(
        std::string(R"({"architectures": ["X"], "num_attention_heads": )") + bad + "}",
        "config.json");
    ASSERT_FALSE(c.ok()) << bad;
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(
        Msg(c.status()),
        std::string("config.json: num_attention_heads: must be a positive integer, got ") + bad);
  }
}

TEST(ModelConfig, MalformedJsonNamesFile) {
  auto c = ParseModelConfig("{\"architectures\": [", "/m/config.json");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(c.status()), HasSubstr("/m/config.json: malformed JSON"));
}

TEST(ModelConfig, MissingOrBadArchitectures) {
  auto missing = ParseModelConfig(R"({"torch_dtype": "bfloat16"})", "/m/config.json");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Msg(missing.status()), "/m/config.json: architectures: missing");

  for (std::string arch : {"[]", "\"Llama\"", "[3]", "[\"\"]"}) {
    SCOPED_TRACE(arch);
    auto bad = ParseModelConfig("{\"architectures\": " + arch + "}", "/m/config.json");
    ASSERT_FALSE(bad.ok());
    EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(Msg(bad.status()),
                HasSubstr("/m/config.json: architectures: must be a non-empty list of strings"));
  }
}

TEST(ModelConfig, NonObjectRejected) {
  auto c = ParseModelConfig("[1, 2]", "config.json");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Msg(c.status()), "config.json: must hold a JSON object, got array");
}

class TempDir {
 public:
  TempDir() {
    std::string tmpl =
        (std::filesystem::temp_directory_path() / "model_config_test.XXXXXX").string();
    EXPECT_NE(::mkdtemp(tmpl.data()), nullptr);
    path_ = tmpl;
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

TEST(ReadModelConfig, ReadsFromModelDir) {
  TempDir dir;
  std::ofstream(dir.path() + "/config.json")
      << ConfigWith(R"({"quant_method": "fp8", "weight_block_size": [128, 128]})");
  auto c = ReadModelConfig(dir.path());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, "LlamaForCausalLM");
  EXPECT_EQ(c->quantization.method, "fp8_block");
}

TEST(ReadModelConfig, MissingFileIsNotFoundNamingPath) {
  TempDir dir;
  auto c = ReadModelConfig(dir.path());
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Msg(c.status()), HasSubstr(dir.path() + "/config.json"));
}

TEST(ReadModelConfig, MalformedFileNamesPath) {
  TempDir dir;
  std::ofstream(dir.path() + "/config.json") << "not json";
  auto c = ReadModelConfig(dir.path());
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(c.status()), HasSubstr(dir.path() + "/config.json: malformed JSON"));
}

ModelConfig ConfigOf(const std::string& quantization_config) {
  auto c = ParseModelConfig(ConfigWith(quantization_config), "config.json");
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *c : ModelConfig{};
}

ModelSpec SpecAsking(const std::string& quantization) {
  ModelSpec s;
  s.name = "m";
  s.model_dir = "/m";
  s.quantization = quantization;
  return s;
}

TEST(ResolveQuantization, AutoTakesTheCheckpoints) {
  ModelConfig fp8 = ConfigOf(R"({"quant_method": "fp8", "weight_block_size": [128, 128]})");
  auto q = ResolveQuantization(SpecAsking("auto"), fp8);
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_EQ(q->method, "fp8_block");
  EXPECT_EQ(q->config_sha256, fp8.quantization.config_sha256);

  auto none = ResolveQuantization(SpecAsking("auto"), ConfigOf(""));
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(none->method, "none");
}

TEST(ResolveQuantization, ExplicitMatchAccepted) {
  auto q =
      ResolveQuantization(SpecAsking("fp8_block"),
                          ConfigOf(R"({"quant_method": "fp8", "weight_block_size": [128, 128]})"));
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_EQ(q->method, "fp8_block");
  auto n = ResolveQuantization(SpecAsking("none"), ConfigOf(""));
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(n->method, "none");
}

TEST(ResolveQuantization, MismatchesAreUnimplemented) {
  auto dequant = ResolveQuantization(
      SpecAsking("none"), ConfigOf(R"({"quant_method": "fp8", "weight_block_size": [128, 128]})"));
  ASSERT_FALSE(dequant.ok());
  EXPECT_EQ(dequant.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(Msg(dequant.status()),
              HasSubstr("m: quantization 'none' asked, but the checkpoint is quantized as "
                        "'fp8_block'"));
}

TEST(ResolveQuantization, Fp8BlockOnAnUnquantizedCheckpointIsOnlineQuantization) {
  auto online = ResolveQuantization(SpecAsking("fp8_block"), ConfigOf(""));
  ASSERT_TRUE(online.ok()) << online.status();
  EXPECT_EQ(online->method, "fp8_block");
  EXPECT_TRUE(online->online);
  EXPECT_EQ(online->weight_block_size, (std::vector<int>{128, 128}));
  EXPECT_EQ(online->canonical_config,
            R"({"activation_scheme":"dynamic","fmt":"e4m3","online":true,"quant_method":"fp8",)"
            R"("quantized_layers":"linear-v1","weight_block_size":[128,128]})");
  EXPECT_EQ(online->config_sha256,
            Sha256Hex(online->canonical_config.data(), online->canonical_config.size()));
  // A pre-quantized checkpoint asked as fp8_block is served as stored, not "online".
  auto stored =
      ResolveQuantization(SpecAsking("fp8_block"),
                          ConfigOf(R"({"quant_method": "fp8", "weight_block_size": [128, 128]})"));
  ASSERT_TRUE(stored.ok()) << stored.status();
  EXPECT_FALSE(stored->online);
  EXPECT_NE(stored->config_sha256, online->config_sha256);
}

TEST(ResolveQuantization, UnsupportedMethodsNamedWithTheList) {
  ModelConfig config = ConfigOf("");
  config.quantization.method = "awq";  // a hand-built config bypassing the parser
  auto q = ResolveQuantization(SpecAsking("auto"), config);
  ASSERT_FALSE(q.ok());
  EXPECT_EQ(q.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_EQ(Msg(q.status()), "m: quantization 'awq' is not served (supported: none, fp8_block)");

  auto asked = ResolveQuantization(SpecAsking("gptq"), ConfigOf(""));
  ASSERT_FALSE(asked.ok());
  EXPECT_EQ(asked.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_EQ(Msg(asked.status()),
            "m: quantization 'gptq' is not served (supported: none, fp8_block)");
}

// Issue 14: a FIFO as config.json hung `load` forever (and kept a preloading daemon from
// ever serving).
TEST(ReadModelConfig, FifoFailsAtOnceNamingIt) {
  TempDir dir;
  ::weightcache::testing::FifoGuard fifo(dir.path() + "/config.json");
  ASSERT_TRUE(fifo.made());
  auto c = ReadModelConfig(dir.path());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Msg(c.status()), dir.path() + "/config.json: is a FIFO, not a regular file");
  EXPECT_FALSE(fifo.fired()) << "ReadModelConfig blocked on the FIFO";
}

TEST(ModelConfig, DeepNestingIsRefusedUnparsed) {
  auto c =
      ParseModelConfig(R"({"architectures":["X"],"x":)" + std::string(1 << 20, '['), "config.json");
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Msg(c.status()),
            "config.json: nests arrays/objects deeper than 64 levels (refused unparsed)");
}

TEST(ModelConfig, EchoedValuesAreCut) {
  const std::string method(100000, 'q');
  auto c = ParseModelConfig(
      R"({"architectures":["X"],"quantization_config":{"quant_method":")" + method + R"("}})",
      "config.json");
  EXPECT_EQ(c.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(Msg(c.status()), HasSubstr("config.json: quantization 'qqqq"));
  EXPECT_LT(Msg(c.status()).size(), 300u);
  c = ParseModelConfig(R"({"architectures":[)" + std::string(5000, '1') + "]}", "config.json");
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_LT(Msg(c.status()).size(), 300u);
}

}  // namespace
}  // namespace weightcache::spec
