#include "pkg/spec/spec.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "nlohmann/json.hpp"

namespace weightcache::spec {
namespace {

using ::testing::HasSubstr;

// A per-test temporary directory, removed afterwards.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "spec_test.XXXXXX").string();
    char* made = ::mkdtemp(tmpl.data());
    EXPECT_NE(made, nullptr);
    path_ = tmpl;
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  const std::string& path() const { return path_; }
  std::string Write(const std::string& name, const std::string& text) const {
    std::string p = path_ + "/" + name;
    std::ofstream(p) << text;
    return p;
  }

 private:
  std::string path_;
};

ModelSpec ParseOne(const std::string& text) {
  auto specs = ParseSpecs(text, "t.yaml");
  EXPECT_TRUE(specs.ok()) << specs.status();
  if (!specs.ok()) return {};
  EXPECT_EQ(specs->size(), 1u);
  return specs->empty() ? ModelSpec{} : specs->front();
}

// Expects INVALID_ARGUMENT with exactly `message`.
void ExpectInvalid(const std::string& text, const std::string& message) {
  auto specs = ParseSpecs(text, "specs.yaml");
  ASSERT_FALSE(specs.ok()) << "accepted:\n" << text;
  EXPECT_EQ(specs.status().code(), absl::StatusCode::kInvalidArgument) << specs.status();
  EXPECT_EQ(std::string(specs.status().message()), message);
}

TEST(SpecParse, SingleYaml) {
  ModelSpec s = ParseOne(R"(
version: 1
name: llama-8b
model_dir: /models/llama-8b
architecture: LlamaForCausalLM
revision: main
tp_size: 4
tp_ranks: [1, 3]
pp_size: 2
pp_rank: 1
dtype: bf16
quantization: fp8_block
)");
  EXPECT_EQ(s.version, 1);
  EXPECT_EQ(s.name, "llama-8b");
  EXPECT_EQ(s.model_dir, "/models/llama-8b");
  EXPECT_EQ(s.architecture, "LlamaForCausalLM");
  EXPECT_EQ(s.revision, "main");
  EXPECT_EQ(s.tp_size, 4);
  EXPECT_EQ(s.tp_ranks, (std::vector<int>{1, 3}));
  EXPECT_EQ(s.pp_size, 2);
  EXPECT_EQ(s.pp_rank, 1);
  EXPECT_EQ(s.dtype, "bf16");
  EXPECT_EQ(s.quantization, "fp8_block");
}

TEST(SpecParse, DefaultsForOmittedKeys) {
  ModelSpec s = ParseOne("name: m\nmodel_dir: /m\n");
  EXPECT_EQ(s.version, kSpecVersion);
  EXPECT_EQ(s.architecture, "");
  EXPECT_EQ(s.revision, "");
  EXPECT_EQ(s.tp_size, 1);
  EXPECT_TRUE(s.tp_ranks.empty());
  EXPECT_EQ(s.pp_size, 1);
  EXPECT_EQ(s.pp_rank, 0);
  EXPECT_EQ(s.dtype, "auto");
  EXPECT_EQ(s.quantization, "auto");
}

TEST(SpecParse, ModelsList) {
  auto specs = ParseSpecs(R"(
models:
  - name: a
    model_dir: /m/a
  - name: b
    model_dir: /m/b
    tp_size: 8
)",
                          "values.yaml");
  ASSERT_TRUE(specs.ok()) << specs.status();
  ASSERT_EQ(specs->size(), 2u);
  EXPECT_EQ((*specs)[0].name, "a");
  EXPECT_EQ((*specs)[0].model_dir, "/m/a");
  EXPECT_EQ((*specs)[0].tp_size, 1);
  EXPECT_EQ((*specs)[1].name, "b");
  EXPECT_EQ((*specs)[1].tp_size, 8);
}

TEST(SpecParse, JsonForm) {
  auto specs = ParseSpecs(
      R"({"models": [{"version": 1, "name": "q", "model_dir": "/m/q", "tp_size": 2,
                      "tp_ranks": [1], "dtype": "fp16", "revision": "abc123"}]})",
      "specs.json");
  ASSERT_TRUE(specs.ok()) << specs.status();
  ASSERT_EQ(specs->size(), 1u);
  const ModelSpec& s = specs->front();
  EXPECT_EQ(s.name, "q");
  EXPECT_EQ(s.model_dir, "/m/q");
  EXPECT_EQ(s.tp_size, 2);
  EXPECT_EQ(s.tp_ranks, (std::vector<int>{1}));
  EXPECT_EQ(s.dtype, "fp16");
  EXPECT_EQ(s.revision, "abc123");
}

TEST(SpecParse, JsonStringIsNotAnInteger) {
  auto specs = ParseSpecs(R"({"name": "q", "model_dir": "/m", "tp_size": "2"})", "s.json");
  ASSERT_FALSE(specs.ok());
  EXPECT_EQ(specs.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(specs.status().message()),
            "s.json: tp_size: must be an integer, got string \"2\"");
}

TEST(SpecParse, LoadSpecFile) {
  TempDir dir;
  std::string path = dir.Write("specs.yaml", "models:\n  - {name: x, model_dir: /m/x}\n");
  auto specs = LoadSpecFile(path);
  ASSERT_TRUE(specs.ok()) << specs.status();
  ASSERT_EQ(specs->size(), 1u);
  EXPECT_EQ(specs->front().name, "x");

  // Errors name the file as given.
  std::string bad = dir.Write("bad.yaml", "name: x\nmodel_dir: /m\ntp_size: 0\n");
  auto status = LoadSpecFile(bad).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(status.message()), bad + ": tp_size: must be >= 1, got 0");
}

TEST(SpecParse, LoadSpecFileMissing) {
  TempDir dir;
  const std::string path = dir.path() + "/absent.yaml";
  auto specs = LoadSpecFile(path);
  ASSERT_FALSE(specs.ok());
  EXPECT_EQ(specs.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(specs.status().message()), HasSubstr(path));
}

TEST(SpecParse, MalformedYamlNamesSourceAndLine) {
  auto specs = ParseSpecs("name: x\nmodel_dir: [unclosed\n", "specs.yaml");
  ASSERT_FALSE(specs.ok());
  EXPECT_EQ(specs.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(specs.status().message()), HasSubstr("specs.yaml:"));
  EXPECT_THAT(std::string(specs.status().message()), HasSubstr("malformed YAML/JSON"));
}

TEST(SpecParse, EmptyAndNonMappingRejected) {
  ExpectInvalid("", "specs.yaml: empty, expected a spec");
  ExpectInvalid("- a\n- b\n", "specs.yaml: expected a spec mapping or `models:`, got a list");
  ExpectInvalid("models: 3\n", "specs.yaml: models: must be a list, got \"3\"");
  auto empty = ParseSpecs("models: []\n", "specs.yaml");
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_TRUE(empty->empty());
  ExpectInvalid("models:\n  - 3\n", "specs.yaml: models[0]: a spec must be a mapping, got \"3\"");
}

// The Helm chart's values schema validates `models` (additionalProperties: false): a spec key
// it lacks would be refused by `helm install` though the daemon takes it.
TEST(SpecParse, TheChartSchemaKnowsExactlyTheSpecKeys) {
  auto bad = ParseSpecs("name: a\nmodel_dir: /a\nzzz: 1\n", "x");
  ASSERT_FALSE(bad.ok());
  const std::string msg(bad.status().message());
  const size_t at = msg.find("(known: ");
  ASSERT_NE(at, std::string::npos) << msg;
  std::vector<std::string> keys = absl::StrSplit(msg.substr(at + 8, msg.rfind(')') - at - 8), ", ");
  std::ifstream in(WC_CHART_SCHEMA);
  ASSERT_TRUE(in.good()) << WC_CHART_SCHEMA;
  const auto schema = nlohmann::json::parse(in);
  std::vector<std::string> chart;
  for (const auto& [key, value] : schema["properties"]["models"]["items"]["properties"].items()) {
    chart.push_back(key);
  }
  std::sort(keys.begin(), keys.end());
  std::sort(chart.begin(), chart.end());
  EXPECT_EQ(chart, keys);
}

TEST(SpecParse, UnknownKeyNamesKeyAndSource) {
  auto specs = ParseSpecs(
      "models:\n  - {name: a, model_dir: /a}\n  - {name: b, model_dir: /b, "
      "tensor_parallel: 2}\n",
      "specs.yaml");
  ASSERT_FALSE(specs.ok());
  EXPECT_EQ(specs.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(specs.status().message()),
              HasSubstr("specs.yaml: models[1]: unknown key \"tensor_parallel\" (known: "));

  ExpectInvalid(
      "name: a\nmodel_dir: /a\ntp: 2\n",
      "specs.yaml: unknown key \"tp\" (known: version, name, model_dir, architecture, "
      "revision, tp_size, tp_ranks, pp_size, pp_rank, dtype, quantization, layout, "
      "allowed_namespaces, isolation, publishers, native_publishers, digests, segment_digests)");
  ExpectInvalid("models:\n  - {name: a, model_dir: /a}\nname: b\n",
                "specs.yaml: unknown key \"name\" beside `models:` (keys go in each model)");
}

TEST(SpecParse, DuplicateKeyRejected) {
  ExpectInvalid("name: a\nmodel_dir: /a\ntp_size: 2\ntp_size: 4\n",
                "specs.yaml: duplicate key \"tp_size\"");
}

TEST(SpecParse, DuplicateNameRejected) {
  ExpectInvalid(
      "models:\n  - {name: a, model_dir: /a}\n  - {name: b, model_dir: /b}\n"
      "  - {name: a, model_dir: /c}\n",
      "specs.yaml: models[2].name: duplicate name \"a\" (also models[0])");
}

TEST(SpecParse, WrongTypesNameTheKey) {
  ExpectInvalid("name: a\nmodel_dir: /a\ntp_size: two\n",
                "specs.yaml: tp_size: must be an integer, got \"two\"");
  ExpectInvalid("name: a\nmodel_dir: /a\npp_rank: 1.5\n",
                "specs.yaml: pp_rank: must be an integer, got \"1.5\"");
  ExpectInvalid("name: a\nmodel_dir: /a\ntp_size: 99999999999\n",
                "specs.yaml: tp_size: must be an integer, got \"99999999999\"");
  ExpectInvalid("name: [a]\nmodel_dir: /a\n", "specs.yaml: name: must be a string, got a list");
  ExpectInvalid("name: a\nmodel_dir: {x: 1}\n",
                "specs.yaml: model_dir: must be a string, got a mapping");
  ExpectInvalid("name: a\nmodel_dir: /a\ntp_ranks: 0\n",
                "specs.yaml: tp_ranks: must be a list of integers, got \"0\"");
  ExpectInvalid("name: a\nmodel_dir: /a\ntp_size: 2\ntp_ranks: [0, x]\n",
                "specs.yaml: tp_ranks[1]: must be an integer, got \"x\"");
  ExpectInvalid("models:\n  - {name: a, model_dir: /a, version: '1'}\n",
                "specs.yaml: models[0].version: must be an integer, got string \"1\"");
}

struct Fault {
  std::string yaml_line;  // appended to a valid spec (inside models[1])
  std::string message;    // after "specs.yaml: models[1]."
};
void PrintTo(const Fault& f, std::ostream* os) { *os << f.yaml_line; }

class SpecValidation : public ::testing::TestWithParam<Fault> {};

TEST_P(SpecValidation, RejectedWithFieldAndSource) {
  const Fault& f = GetParam();
  // models[1] is a valid spec plus the faulty line (which replaces name or model_dir).
  std::vector<std::string> lines;
  if (f.yaml_line.rfind("name:", 0) != 0) lines.emplace_back("name: m");
  if (f.yaml_line.rfind("model_dir:", 0) != 0) lines.emplace_back("model_dir: /m");
  lines.push_back(f.yaml_line);
  std::string text = "models:\n  - name: ok\n    model_dir: /ok\n";
  for (size_t i = 0; i < lines.size(); ++i) text += (i == 0 ? "  - " : "    ") + lines[i] + "\n";
  auto specs = ParseSpecs(text, "specs.yaml");
  ASSERT_FALSE(specs.ok()) << text;
  EXPECT_EQ(specs.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(specs.status().message()), "specs.yaml: models[1]." + f.message) << text;
}

INSTANTIATE_TEST_SUITE_P(
    Faults, SpecValidation,
    ::testing::Values(
        Fault{"version: 2", "version: must be 1, got 2"},
        Fault{"version: 0", "version: must be 1, got 0"},
        Fault{"name: Llama", "name: must match [a-z0-9][a-z0-9._-]{0,62}, got \"Llama\""},
        Fault{"name: -x", "name: must match [a-z0-9][a-z0-9._-]{0,62}, got \"-x\""},
        Fault{"name: a/b", "name: must match [a-z0-9][a-z0-9._-]{0,62}, got \"a/b\""},
        Fault{"name: " + std::string(64, 'a'),
              "name: must match [a-z0-9][a-z0-9._-]{0,62}, got \"" + std::string(64, 'a') + "\""},
        Fault{"name: ''", "name: required"}, Fault{"model_dir: ''", "model_dir: required"},
        Fault{"tp_size: 0", "tp_size: must be >= 1, got 0"},
        Fault{"tp_size: -3", "tp_size: must be >= 1, got -3"},
        Fault{"tp_size: 1025", "tp_size: must be <= 1024, got 1025"},
        Fault{"tp_ranks: [0, 1]", "tp_ranks[1]: must be in [0, 1) (tp_size), got 1"},
        Fault{"tp_ranks: [-1]", "tp_ranks[0]: must be in [0, 1) (tp_size), got -1"},
        Fault{"tp_ranks: [0, 0]", "tp_ranks[1]: duplicate rank 0 (also tp_ranks[0])"},
        Fault{"pp_size: 0", "pp_size: must be >= 1, got 0"},
        Fault{"pp_size: 2000", "pp_size: must be <= 1024, got 2000"},
        Fault{"pp_rank: 1", "pp_rank: must be in [0, 1) (pp_size), got 1"},
        Fault{"pp_rank: -1", "pp_rank: must be in [0, 1) (pp_size), got -1"},
        Fault{"dtype: int8", "dtype: must be one of auto, bf16, fp16, fp32, got \"int8\""},
        Fault{"quantization: awq",
              "quantization: must be one of auto, none, fp8_block, got \"awq\""}),
    [](const ::testing::TestParamInfo<Fault>& info) {
      const std::string& line = info.param.yaml_line;
      return line.substr(0, line.find(':')) + "_" + std::to_string(info.index);
    });

TEST(SpecValidate, LimitsAccepted) {
  ModelSpec s;
  s.name = "a" + std::string(62, 'z');  // 63 characters: the longest name
  s.model_dir = "/m";
  s.tp_size = 1024;
  s.tp_ranks = {0, 1023, 512};
  s.pp_size = 1024;
  s.pp_rank = 1023;
  EXPECT_TRUE(Validate(s).ok()) << Validate(s);
  s.name = "0a._-";
  EXPECT_TRUE(Validate(s).ok()) << Validate(s);
}

TEST(SpecValidate, DirectCallNamesFieldWithoutSource) {
  ModelSpec s;
  s.name = "m";
  s.model_dir = "/m";
  s.tp_size = 2;
  s.tp_ranks = {2};
  absl::Status st = Validate(s);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(st.message()), "tp_ranks[0]: must be in [0, 2) (tp_size), got 2");
}

TEST(SpecFlag, AllKeys) {
  auto s = ParseSpecFlag(
      "version=1,name=llama,model_dir=/m/llama,architecture=LlamaForCausalLM,revision=r1,"
      "tp_size=4,tp_ranks=0,2,3,pp_size=2,pp_rank=1,dtype=fp32,quantization=none");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->name, "llama");
  EXPECT_EQ(s->model_dir, "/m/llama");
  EXPECT_EQ(s->architecture, "LlamaForCausalLM");
  EXPECT_EQ(s->revision, "r1");
  EXPECT_EQ(s->tp_size, 4);
  EXPECT_EQ(s->tp_ranks, (std::vector<int>{0, 2, 3}));
  EXPECT_EQ(s->pp_size, 2);
  EXPECT_EQ(s->pp_rank, 1);
  EXPECT_EQ(s->dtype, "fp32");
  EXPECT_EQ(s->quantization, "none");
}

TEST(SpecFlag, ExampleFromHeader) {
  auto s = ParseSpecFlag("name=llama,model_dir=/m/llama,tp_size=1,tp_ranks=0");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->name, "llama");
  EXPECT_EQ(s->tp_ranks, (std::vector<int>{0}));
  EXPECT_EQ(s->dtype, "auto");
}

TEST(SpecFlag, ValueMayHoldEquals) {
  auto s = ParseSpecFlag("name=a,model_dir=/m/a=b");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->model_dir, "/m/a=b");
}

TEST(SpecFlag, Errors) {
  auto expect = [](const std::string& flag, const std::string& message) {
    auto s = ParseSpecFlag(flag);
    ASSERT_FALSE(s.ok()) << flag;
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << flag;
    EXPECT_EQ(std::string(s.status().message()), message) << flag;
  };
  expect("name=a,model_dir=/a,tp=2",
         "flag: unknown key \"tp\" (known: version, name, model_dir, "
         "architecture, revision, tp_size, tp_ranks, pp_size, "
         "pp_rank, dtype, quantization, layout, "
         "allowed_namespaces, isolation, publishers, native_publishers, digests, segment_digests)");
  expect("name=a,model_dir=/a,tp_size=x", "flag: tp_size: must be an integer, got \"x\"");
  expect("name=a,model_dir=/a,tp_size=0", "flag: tp_size: must be >= 1, got 0");
  expect("name=a,model_dir=/a,tp_size=2,tp_ranks=0,5",
         "flag: tp_ranks[1]: must be in [0, 2) (tp_size), got 5");
  expect("name=a,model_dir=/a,tp_ranks=0,x", "flag: tp_ranks[1]: must be an integer, got \"x\"");
  expect("name=a,model_dir=/a,name=b", "flag: duplicate key \"name\"");
  expect("name=a,bogus,model_dir=/a", "flag: expected key=value, got \"bogus\"");
  expect("name=a,model_dir=/a,", "flag: expected key=value, got \"\"");
  expect("model_dir=/a", "flag: name: required");
  expect("", "flag: name: required");
}

TEST(SpecYaml, RoundTrip) {
  ModelSpec s;
  s.name = "qwen3-235b.fp8";
  s.model_dir = "/models/with space/and: colon #hash";
  s.architecture = "Qwen3MoeForCausalLM";
  s.revision = "null";  // would come back as YAML null if not quoted
  s.tp_size = 8;
  s.tp_ranks = {7, 0, 3};
  s.pp_size = 2;
  s.pp_rank = 1;
  s.dtype = "bf16";
  s.quantization = "fp8_block";
  s.layout = "sglang";
  const std::string yaml = ToYaml(s);
  auto back = ParseSpecs(yaml, "roundtrip");
  ASSERT_TRUE(back.ok()) << back.status() << "\n" << yaml;
  ASSERT_EQ(back->size(), 1u);
  const ModelSpec& b = back->front();
  EXPECT_EQ(b.version, s.version);
  EXPECT_EQ(b.name, s.name);
  EXPECT_EQ(b.model_dir, s.model_dir);
  EXPECT_EQ(b.architecture, s.architecture);
  EXPECT_EQ(b.revision, s.revision);
  EXPECT_EQ(b.tp_size, s.tp_size);
  EXPECT_EQ(b.tp_ranks, s.tp_ranks);
  EXPECT_EQ(b.pp_size, s.pp_size);
  EXPECT_EQ(b.pp_rank, s.pp_rank);
  EXPECT_EQ(b.dtype, s.dtype);
  EXPECT_EQ(b.quantization, s.quantization);
  EXPECT_EQ(b.layout, s.layout);
  // Canonical: rendering again gives the same text.
  EXPECT_EQ(ToYaml(b), yaml);
}

TEST(SpecYaml, CanonicalText) {
  ModelSpec s;
  s.name = "m";
  s.model_dir = "/m";
  EXPECT_EQ(ToYaml(s),
            "version: 1\n"
            "name: \"m\"\n"
            "model_dir: \"/m\"\n"
            "architecture: \"\"\n"
            "revision: \"\"\n"
            "tp_size: 1\n"
            "tp_ranks: []\n"
            "pp_size: 1\n"
            "pp_rank: 0\n"
            "dtype: \"auto\"\n"
            "quantization: \"auto\"\n"
            "layout: \"hf\"\n");
  auto back = ParseSpecs(ToYaml(s), "x");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(back->front().tp_ranks.empty());
}

TEST(SpecYaml, NullKeepsDefault) {
  ModelSpec s = ParseOne("name: m\nmodel_dir: /m\narchitecture:\ntp_ranks: ~\ndtype: null\n");
  EXPECT_EQ(s.architecture, "");
  EXPECT_TRUE(s.tp_ranks.empty());
  EXPECT_EQ(s.dtype, "auto");
}

TEST(SpecLayout, DefaultsToHfAndAcceptsEngineLayouts) {
  EXPECT_EQ(ParseOne("name: m\nmodel_dir: /m\n").layout, "hf");
  EXPECT_EQ(ParseOne("name: m\nmodel_dir: /m\nlayout: sglang\n").layout, "sglang");
  EXPECT_EQ(ParseOne("name: m\nmodel_dir: /m\nlayout: vllm\n").layout, "vllm");
  auto flag = ParseSpecFlag("name=m,model_dir=/m,layout=vllm");
  ASSERT_TRUE(flag.ok()) << flag.status();
  EXPECT_EQ(flag->layout, "vllm");
}

TEST(SpecLayout, UnknownLayoutNamesTheChoices) {
  ExpectInvalid("name: m\nmodel_dir: /m\nlayout: trtllm\n",
                "specs.yaml: layout: must be one of hf, sglang, vllm, got \"trtllm\"");
  auto flag = ParseSpecFlag("name=m,model_dir=/m,layout=");
  ASSERT_FALSE(flag.ok());
  EXPECT_EQ(std::string(flag.status().message()),
            "flag: layout: must be one of hf, sglang, vllm, got \"\"");
}

// Issue 14 #3: a 900 KiB spec of '[' cost +208 MB before any check. The limits are checked
// before a node is built; the text is refused at the first level too deep.
TEST(SpecLimits, DeepFlowNestingIsRefusedBeforeParsing) {
  const std::string message =
      "specs.yaml: lists and mappings nested deeper than 16 levels (a spec needs 4; refused "
      "unparsed)";
  ExpectInvalid(std::string(900 * 1024, '['), message);
  ExpectInvalid("name: x\nmodel_dir: " + std::string(17, '{'), message);
  // Brackets in quoted scalars and comments do not count.
  EXPECT_EQ(ParseOne("name: x # [[[[[[[[[[[[[[[[[[[[\nmodel_dir: \"/m/[[[[[[[[[[[[[[[[[[[[\"\n"
                     "revision: '[[[[[[[[[[[[[[[[[['\n")
                .model_dir,
            "/m/[[[[[[[[[[[[[[[[[[[[");
}

TEST(SpecLimits, DeepBlockNestingIsRefusedBeforeParsing) {
  std::string text;
  for (int i = 0; i < 200000; ++i) text += "- ";
  ExpectInvalid(text,
                "specs.yaml:1:33: lists and mappings nested deeper than 16 levels (a spec needs "
                "4; refused unparsed)");
}

TEST(SpecLimits, OversizedTextIsRefusedUnparsed) {
  const std::string text = "name: x\nrevision: \"" + std::string(kMaxSpecBytes, 'r') + "\"\n";
  ExpectInvalid(text, absl::StrCat("specs.yaml: spec text is ", text.size(),
                                   " bytes, above the limit of 1048576 (refused unparsed)"));
}

TEST(SpecLimits, TooManyValuesAreRefused) {
  std::string text = "tp_ranks: [";
  for (size_t i = 0; i <= kMaxSpecNodes; ++i) text += "0,";
  text += "]\n";
  auto specs = ParseSpecs(text, "specs.yaml");
  EXPECT_EQ(specs.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(specs.status().message()),
              HasSubstr("more than 100000 values (refused unparsed)"));
}

TEST(SpecLimits, TheLimitsLeaveRoomForARealDaemonList) {
  std::string text = "models:\n";
  for (int i = 0; i < 1000; ++i) {
    text += absl::StrCat("  - name: m", i, "\n    model_dir: /models/m", i,
                         "\n    tp_size: 8\n    tp_ranks: [0, 1, 2, 3, 4, 5, 6, 7]\n");
  }
  auto specs = ParseSpecs(text, "specs.yaml");
  ASSERT_TRUE(specs.ok()) << specs.status();
  EXPECT_EQ(specs->size(), 1000u);
}

// Issue 14: an oversized model name was echoed back whole, so the reply itself failed.
TEST(SpecLimits, EchoedValuesAreEscapedAndCut) {
  auto specs = ParseSpecs("name: \"" + std::string(100000, 'N') + "\"\nmodel_dir: /m\n", "rpc");
  EXPECT_EQ(specs.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string msg(specs.status().message());
  EXPECT_THAT(msg, HasSubstr("rpc: name: must match [a-z0-9][a-z0-9._-]{0,62}, got \"NNN"));
  EXPECT_THAT(msg, HasSubstr("...\" (100000 bytes)"));
  EXPECT_LT(msg.size(), 300u);
  specs = ParseSpecs("name: \"a\\u0000b\\nc\"\nmodel_dir: /m\n", "rpc");
  EXPECT_THAT(std::string(specs.status().message()), HasSubstr("got \"a\\000b\\nc\""));
}

// Found by fuzz_spec: a model_dir with invalid UTF-8 or control characters did not come
// back equal through ToYaml (and would print as something else in messages).
TEST(SpecValidate, FreeTextIsBoundedUtf8WithoutControlCharacters) {
  auto flag = ParseSpecFlag("name=llama,model_dir=/m/ll\xff\xffmodels");
  EXPECT_EQ(flag.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(flag.status().message()),
            "flag: model_dir: must be UTF-8, got byte 5 of \"/m/ll\\377\\377models\"");
  flag = ParseSpecFlag("name=llama,model_dir=/m\n/x");
  EXPECT_EQ(std::string(flag.status().message()),
            "flag: model_dir: must not hold control characters, got one at byte 2 of "
            "\"/m\\n/x\"");
  ExpectInvalid("name: x\nmodel_dir: /m\nrevision: \"a\\u0085\"\n",
                "specs.yaml: revision: must not hold control characters, got one at byte 1 of "
                "\"a\\302\\205\"");
  ExpectInvalid("name: x\nmodel_dir: /m\narchitecture: " + std::string(257, 'A') + "\n",
                "specs.yaml: architecture: must be at most 256 bytes, got 257: \"" +
                    std::string(128, 'A') + "...\" (257 bytes)");
  EXPECT_EQ(ParseOne("name: x\nmodel_dir: /m/\u00e9t\u00e9\n").model_dir, "/m/\u00e9t\u00e9");
}

TEST(SpecNamespaces, AbsentMeansEveryone) {
  EXPECT_TRUE(ParseOne("name: a\nmodel_dir: /a\n").allowed_namespaces.empty());
  EXPECT_TRUE(
      ParseOne("name: a\nmodel_dir: /a\nallowed_namespaces: []\n").allowed_namespaces.empty());
}

TEST(SpecNamespaces, YamlJsonAndFlagForms) {
  EXPECT_EQ(ParseOne("name: a\nmodel_dir: /a\nallowed_namespaces: [team-a, t0, a-b-c9]\n")
                .allowed_namespaces,
            (std::vector<std::string>{"team-a", "t0", "a-b-c9"}));
  EXPECT_EQ(ParseOne(R"({"name": "a", "model_dir": "/a", "allowed_namespaces": ["x"]})")
                .allowed_namespaces,
            (std::vector<std::string>{"x"}));
  auto flag = ParseSpecFlag("name=a,model_dir=/a,allowed_namespaces=team-a,team-b,tp_size=1");
  ASSERT_TRUE(flag.ok()) << flag.status();
  EXPECT_EQ(flag->allowed_namespaces, (std::vector<std::string>{"team-a", "team-b"}));
  EXPECT_EQ(flag->tp_size, 1);
  // 63 characters is the longest namespace name.
  const std::string longest(63, 'n');
  EXPECT_EQ(ParseOne("name: a\nmodel_dir: /a\nallowed_namespaces: [" + longest + "]\n")
                .allowed_namespaces.front(),
            longest);
}

TEST(SpecNamespaces, BadNamesNameTheSpecAndTheValue) {
  const std::string dns =
      " is not a Kubernetes namespace name (a DNS-1123 label: lower-case letters, digits and "
      "'-', starting and ending with a letter or digit, at most 63 characters)";
  for (const std::string& bad : std::vector<std::string>{"Team-A", "team_a", "-team", "team-",
                                                         "te.am", "", std::string(64, 'n')}) {
    ExpectInvalid(
        "models:\n  - {name: llama, model_dir: /a, allowed_namespaces: [ok, \"" + bad + "\"]}\n",
        "specs.yaml: models[0].allowed_namespaces[1]: model \"llama\": \"" + bad + "\"" + dns);
  }
  ExpectInvalid("name: llama\nmodel_dir: /a\nallowed_namespaces: [a, b, a]\n",
                "specs.yaml: allowed_namespaces[2]: model \"llama\": duplicate namespace \"a\" "
                "(also allowed_namespaces[0])");
  ExpectInvalid(
      "name: llama\nmodel_dir: /a\nallowed_namespaces: team-a\n",
      "specs.yaml: allowed_namespaces: must be a list of namespace names, got \"team-a\"");
  ExpectInvalid("name: llama\nmodel_dir: /a\nallowed_namespaces: [[a]]\n",
                "specs.yaml: allowed_namespaces[0]: must be a namespace name, got a list");
  auto flag = ParseSpecFlag("name=llama,model_dir=/a,allowed_namespaces=ok,Bad");
  ASSERT_FALSE(flag.ok());
  EXPECT_EQ(std::string(flag.status().message()),
            "flag: allowed_namespaces[1]: model \"llama\": \"Bad\"" + dns);
}

TEST(SpecNamespaces, RoundTripAndOpenSpecsKeepTheirCanonicalText) {
  ModelSpec s;
  s.name = "llama";
  s.model_dir = "/m";
  const std::string open = ToYaml(s);
  EXPECT_THAT(open, ::testing::Not(HasSubstr("allowed_namespaces")));
  s.allowed_namespaces = {"team-b", "team-a"};
  const std::string yaml = ToYaml(s);
  EXPECT_THAT(yaml, HasSubstr("allowed_namespaces: [\"team-b\", \"team-a\"]"));
  EXPECT_EQ(ParseOne(yaml).allowed_namespaces, s.allowed_namespaces);
}

// isolation: shared (default) | namespace, from YAML and flags; the canonical text of a
// shared spec stays what it was; a bad value names the model and the choices.
TEST(SpecIsolation, ParsedValidatedAndRoundTripped) {
  EXPECT_EQ(ParseOne("name: a\nmodel_dir: /a\n").isolation, "shared");
  EXPECT_FALSE(ParseOne("name: a\nmodel_dir: /a\n").Private());
  const ModelSpec p = ParseOne("name: a\nmodel_dir: /a\nisolation: namespace\n");
  EXPECT_TRUE(p.Private());
  auto flag = ParseSpecFlag("name=a,model_dir=/a,isolation=namespace");
  ASSERT_TRUE(flag.ok()) << flag.status();
  EXPECT_TRUE(flag->Private());
  ModelSpec s;
  s.name = "llama";
  s.model_dir = "/m";
  EXPECT_THAT(ToYaml(s), ::testing::Not(HasSubstr("isolation")));
  EXPECT_TRUE(ParseOne(ToYaml(p)).Private());
  ExpectInvalid("name: llama\nmodel_dir: /a\nisolation: tenant\n",
                "specs.yaml: isolation: model \"llama\": must be one of shared, namespace, got "
                "\"tenant\"");
}

// native_publishers: who may publish native code (aoti-package) for a model besides admins,
// apart from `publishers:`; the same forms and checks, from YAML and flags, round-tripped.
TEST(SpecPublishers, NativePublishersParsedValidatedAndRoundTripped) {
  EXPECT_TRUE(ParseOne("name: a\nmodel_dir: /a\n").native_publishers.empty());
  const ModelSpec p =
      ParseOne("name: a\nmodel_dir: /a\npublishers: [team-a]\nnative_publishers: [\"uid:1000\"]\n");
  EXPECT_EQ(p.native_publishers, std::vector<std::string>({"uid:1000"}));
  EXPECT_EQ(p.publishers, std::vector<std::string>({"team-a"}));
  auto flag = ParseSpecFlag("name=a,model_dir=/a,native_publishers=team-b,uid:0");
  ASSERT_TRUE(flag.ok()) << flag.status();
  EXPECT_EQ(flag->native_publishers, std::vector<std::string>({"team-b", "uid:0"}));
  EXPECT_EQ(ParseOne(ToYaml(p)).native_publishers, p.native_publishers);
  ExpectInvalid("name: llama\nmodel_dir: /a\nnative_publishers: [1000]\n",
                "specs.yaml: native_publishers[0]: model \"llama\": \"1000\" is ambiguous: write "
                "a uid as \"uid:1000\"");
}

// publishers: who may publish for a model (issue 47), namespaces and uid:<n>, from YAML and
// flags; bad entries name the model, the entry and how to write it; absent: any publisher.
TEST(SpecPublishers, ParsedValidatedAndRoundTripped) {
  EXPECT_TRUE(ParseOne("name: a\nmodel_dir: /a\n").publishers.empty());
  const ModelSpec p = ParseOne("name: a\nmodel_dir: /a\npublishers: [team-a, \"uid:1000\"]\n");
  EXPECT_EQ(p.publishers, std::vector<std::string>({"team-a", "uid:1000"}));
  auto flag = ParseSpecFlag("name=a,model_dir=/a,publishers=team-b,uid:0");
  ASSERT_TRUE(flag.ok()) << flag.status();
  EXPECT_EQ(flag->publishers, std::vector<std::string>({"team-b", "uid:0"}));
  EXPECT_EQ(ParseOne(ToYaml(p)).publishers, p.publishers);
  ModelSpec open;
  open.name = "llama";
  open.model_dir = "/m";
  EXPECT_THAT(ToYaml(open), ::testing::Not(HasSubstr("publishers")));
  ExpectInvalid("name: llama\nmodel_dir: /a\npublishers: [1000]\n",
                "specs.yaml: publishers[0]: model \"llama\": \"1000\" is ambiguous: write a uid "
                "as \"uid:1000\"");
  ExpectInvalid("name: llama\nmodel_dir: /a\npublishers: [\"uid:x\"]\n",
                "specs.yaml: publishers[0]: model \"llama\": \"uid:x\" is not uid:<n> with n a "
                "uid (0 to 4294967295)");
  ExpectInvalid("name: llama\nmodel_dir: /a\npublishers: [\"uid:4294967296\"]\n",
                "specs.yaml: publishers[0]: model \"llama\": \"uid:4294967296\" is not uid:<n> "
                "with n a uid (0 to 4294967295)");
  ExpectInvalid("name: llama\nmodel_dir: /a\npublishers: [Team_A]\n",
                "specs.yaml: publishers[0]: model \"llama\": \"Team_A\" is neither a Kubernetes "
                "namespace name (a DNS-1123 label) nor uid:<n>");
  ExpectInvalid("name: llama\nmodel_dir: /a\npublishers: [a, b, a]\n",
                "specs.yaml: publishers[2]: model \"llama\": duplicate publisher \"a\" (also "
                "publishers[0])");
  ExpectInvalid("name: llama\nmodel_dir: /a\npublishers: team-a\n",
                "specs.yaml: publishers: must be a list of namespace names and uid:<n>, got "
                "\"team-a\"");
}

// Pinned digests (issue 48): a mapping of checkpoint file name to SHA-256, lowercased,
// round-tripped, and refused at spec load when a name or a digest is malformed.
TEST(SpecDigests, ParsedLowercasedAndRoundTripped) {
  const std::string a(64, 'a');
  const std::string b = "0123456789ABCDEF0123456789abcdef0123456789abcdef0123456789ABCDEF";
  ModelSpec s = ParseOne("name: llama\nmodel_dir: /a\ndigests:\n  model-00001.safetensors: " + a +
                         "\n  model-00002.safetensors: \"" + b + "\"\n");
  ASSERT_EQ(s.digests.size(), 2u);
  EXPECT_EQ(s.digests.at("model-00001.safetensors"), a);
  EXPECT_EQ(s.digests.at("model-00002.safetensors"), absl::AsciiStrToLower(b));
  auto again = ParseSpecs(ToYaml(s), "canonical");
  ASSERT_TRUE(again.ok()) << again.status() << "\n" << ToYaml(s);
  EXPECT_EQ(again->front().digests, s.digests);
  // JSON too (a digest of digits only stays a string).
  const std::string digits(64, '7');
  ModelSpec j = ParseOne(R"({"name": "j", "model_dir": "/a", "digests": {"m.safetensors": ")" +
                         digits + "\"}}");
  EXPECT_EQ(j.digests.at("m.safetensors"), digits);
  // Absent: empty, and the canonical text of an unpinned spec has no digests key.
  EXPECT_TRUE(ParseOne("name: x\nmodel_dir: /a\n").digests.empty());
  EXPECT_THAT(ToYaml(ParseOne("name: x\nmodel_dir: /a\n")), ::testing::Not(HasSubstr("digests")));
}

TEST(SpecDigests, MalformedDigestsAndNamesNameTheModelTheFileAndWhatIsWrong) {
  ExpectInvalid("name: llama\nmodel_dir: /a\ndigests:\n  model.safetensors: abc123\n",
                "specs.yaml: digests[\"model.safetensors\"]: model \"llama\": must be the file's "
                "SHA-256, 64 hex digits, got \"abc123\" (6 characters)");
  ExpectInvalid(
      "name: llama\nmodel_dir: /a\ndigests:\n  model.safetensors: " + std::string(63, 'a') + "g\n",
      "specs.yaml: digests[\"model.safetensors\"]: model \"llama\": must be the file's "
      "SHA-256, 64 hex digits, got \"" +
          std::string(63, 'a') + "g\" (64 characters)");
  ExpectInvalid("name: llama\nmodel_dir: /a\ndigests:\n  sub/model.safetensors: " +
                    std::string(64, 'a') + "\n",
                "specs.yaml: digests[\"sub/model.safetensors\"]: model \"llama\": must name a "
                "checkpoint file of model_dir (a file name ending in .safetensors, no directory)");
  ExpectInvalid(
      "name: llama\nmodel_dir: /a\ndigests:\n  config.json: " + std::string(64, 'a') + "\n",
      "specs.yaml: digests[\"config.json\"]: model \"llama\": must name a checkpoint "
      "file of model_dir (a file name ending in .safetensors, no directory)");
  ExpectInvalid("name: llama\nmodel_dir: /a\ndigests: [abc]\n",
                "specs.yaml: digests: must be a mapping of checkpoint file name to its SHA-256, "
                "got a list");
  ExpectInvalid("name: llama\nmodel_dir: /a\ndigests:\n  m.safetensors: [a]\n",
                "specs.yaml: digests[\"m.safetensors\"]: must be a SHA-256 (64 hex digits), got a "
                "list");
  auto flag = ParseSpecFlag("name=x,model_dir=/a,digests=m.safetensors");
  ASSERT_FALSE(flag.ok());
  EXPECT_THAT(std::string(flag.status().message()), HasSubstr("pin digests in a spec file"));
}

// Issue 48: pinned segment digests, per fingerprint; each bad one named with the model.
TEST(SpecParse, SegmentDigestsArePerFingerprintAndEachIsChecked) {
  const std::string fp(64, 'a'), d0(64, 'B'), d1(64, 'c');
  auto ok = ParseSpecs("models:\n  - name: m\n    model_dir: /m\n    segment_digests:\n      " +
                           fp + ": [" + d0 + ", " + d1 + "]\n",
                       "specs.yaml");
  ASSERT_TRUE(ok.ok()) << ok.status();
  ASSERT_EQ((*ok)[0].segment_digests.size(), 1u);
  EXPECT_EQ((*ok)[0].segment_digests.at(fp), (std::vector<std::string>{std::string(64, 'b'), d1}));
  for (const auto& [yaml, want] : std::vector<std::pair<std::string, std::string>>{
           {fp + ": [abc]",
            "segment_digests[\"" + fp + "\"][0]: model \"m\": must be a segment's digest"},
           {"abc: [" + d1 + "]", "keys must be fingerprints"},
           {fp + ": []", "lists no segment digest"},
           {fp + ": " + d1, "must be a list of segment digests"}}) {
    auto bad = ParseSpecs(
        "models:\n  - name: m\n    model_dir: /m\n    segment_digests:\n      " + yaml + "\n",
        "specs.yaml");
    ASSERT_FALSE(bad.ok()) << yaml;
    EXPECT_THAT(std::string(bad.status().message()), ::testing::HasSubstr(want)) << yaml;
  }
  auto flag = ParseSpecFlag("name=m,model_dir=/m,segment_digests=x");
  ASSERT_FALSE(flag.ok());
  EXPECT_THAT(std::string(flag.status().message()),
              ::testing::HasSubstr("segment_digests: a mapping, which the flag form cannot hold"));
}

}  // namespace
}  // namespace weightcache::spec
