#include "pkg/spec/fingerprint.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <set>
#include <string>
#include <vector>

namespace weightcache::spec {
namespace {

// A fixed, fully populated input.
FingerprintInputs Sample() {
  FingerprintInputs in;
  in.architecture = "DeepseekV3ForCausalLM";
  in.revision = "main";
  in.files = {
      {"model-00002-of-00002.safetensors", 4000, std::string(64, 'b')},
      {"model-00001-of-00002.safetensors", 5000, std::string(64, 'a')},
  };
  in.layout = Layout{8, 3, 2, 1};
  in.quant_method = "fp8_block";
  in.quant_config_sha256 = std::string(64, 'c');
  in.dtype = "bf16";
  in.env.compute_capability = "sm_90";
  in.env.loader_format_version = 1;
  in.env.engine = "sglang";
  in.env.engine_version = "sglang 0.5.2 / torch 2.8";
  return in;
}

TEST(Sha256Hex, KnownVectors) {
  EXPECT_EQ(Sha256Hex("", 0), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(Sha256Hex("abc", 3),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST(Fingerprint, CanonicalTextIsTheDocumentedFormat) {
  EXPECT_EQ(Sample().Canonical(),
            "weightcache-fingerprint=2\n"
            "architecture=DeepseekV3ForCausalLM\n"
            "revision=main\n"
            "file[model-00001-of-00002.safetensors].size=5000\n"
            "file[model-00001-of-00002.safetensors].content=" +
                std::string(64, 'a') +
                "\n"
                "file[model-00002-of-00002.safetensors].size=4000\n"
                "file[model-00002-of-00002.safetensors].content=" +
                std::string(64, 'b') +
                "\n"
                "tp_size=8\n"
                "tp_rank=3\n"
                "pp_size=2\n"
                "pp_rank=1\n"
                "quant_method=fp8_block\n"
                "quant_config_sha256=" +
                std::string(64, 'c') +
                "\n"
                "dtype=bf16\n"
                "compute_capability=sm_90\n"
                "loader_format_version=1\n"
                "engine=sglang\n"
                "engine_version=sglang 0.5.2 / torch 2.8\n");
}

// Golden digests (checked against an independent SHA-256 of the text above): if these change,
// every cached entry's key changes. Update them only with a deliberate format change (and bump
// the format line or kLoaderFormatVersion).
TEST(Fingerprint, GoldenDigest) {
  EXPECT_EQ(Sample().Digest(), "9a2531a01ee3602d5905578c9d5f23ca23472aeffa1fbdb4d8f731e0ff119f2c");
  EXPECT_EQ(FingerprintInputs{}.Digest(),
            "22a319c97a6a27a5b350333631eb5c88b79bd3ab9c5d7e43e8c609eb921d1fe4");
}

TEST(Fingerprint, StableAndIndependentOfFilesOrder) {
  FingerprintInputs a = Sample();
  FingerprintInputs b = Sample();
  std::swap(b.files[0], b.files[1]);
  EXPECT_EQ(a.Digest(), a.Digest());
  EXPECT_EQ(a.Canonical(), b.Canonical());
  EXPECT_EQ(a.Digest(), b.Digest());
  EXPECT_TRUE(Diff(a, b).empty());
}

struct Mutation {
  std::string field;  // the field Diff must name
  std::function<void(FingerprintInputs*)> apply;
};

// One mutation per canonical field (the format line aside).
std::vector<Mutation> AllMutations() {
  const std::string f1 = "files[model-00001-of-00002.safetensors]";
  return {
      {"architecture", [](auto* in) { in->architecture = "DeepseekV2ForCausalLM"; }},
      {"revision", [](auto* in) { in->revision = "v2"; }},
      {f1 + ".size", [](auto* in) { in->files[1].size = 5001; }},
      {f1 + ".content", [](auto* in) { in->files[1].content = std::string(64, 'd'); }},
      {"tp_size", [](auto* in) { in->layout.tp_size = 4; }},
      {"tp_rank", [](auto* in) { in->layout.tp_rank = 2; }},
      {"pp_size", [](auto* in) { in->layout.pp_size = 1; }},
      {"pp_rank", [](auto* in) { in->layout.pp_rank = 0; }},
      {"quant_method", [](auto* in) { in->quant_method = "none"; }},
      {"quant_config_sha256", [](auto* in) { in->quant_config_sha256 = std::string(64, 'e'); }},
      {"dtype", [](auto* in) { in->dtype = "fp16"; }},
      {"compute_capability", [](auto* in) { in->env.compute_capability = "sm_100"; }},
      {"loader_format_version", [](auto* in) { in->env.loader_format_version = 2; }},
      {"engine", [](auto* in) { in->env.engine = "vllm"; }},
      {"engine_version", [](auto* in) { in->env.engine_version = "sglang 0.5.3 / torch 2.8"; }},
  };
}

TEST(Fingerprint, MutationsCoverEveryCanonicalLine) {
  // 13 scalar fields + 2 lines per file; the format line is not an input. A new field in
  // Canonical() must get a mutation above.
  const std::string canonical = Sample().Canonical();
  const size_t lines = std::count(canonical.begin(), canonical.end(), '\n');
  const size_t per_extra_file_lines = 2;
  EXPECT_EQ(AllMutations().size(), lines - 1 - per_extra_file_lines);
}

TEST(Fingerprint, EveryFieldChangesTheDigestAndIsNamedByDiff) {
  const FingerprintInputs base = Sample();
  std::set<std::string> digests = {base.Digest()};
  for (const Mutation& m : AllMutations()) {
    SCOPED_TRACE(m.field);
    FingerprintInputs changed = base;
    m.apply(&changed);
    EXPECT_NE(changed.Digest(), base.Digest());
    digests.insert(changed.Digest());
    std::vector<FieldDiff> diffs = Diff(base, changed);
    ASSERT_EQ(diffs.size(), 1u) << FormatDiff(diffs);
    EXPECT_EQ(diffs[0].field, m.field);
    EXPECT_NE(diffs[0].cached, diffs[0].asked);
    // Both values are the real ones, cached first.
    std::vector<FieldDiff> reverse = Diff(changed, base);
    ASSERT_EQ(reverse.size(), 1u);
    EXPECT_EQ(reverse[0].cached, diffs[0].asked);
    EXPECT_EQ(reverse[0].asked, diffs[0].cached);
  }
  // All mutated inputs are distinct from each other too.
  EXPECT_EQ(digests.size(), AllMutations().size() + 1);
}

TEST(Fingerprint, DiffCarriesBothValues) {
  FingerprintInputs cached = Sample();
  FingerprintInputs asked = Sample();
  asked.layout.tp_size = 4;
  asked.dtype = "fp16";
  std::vector<FieldDiff> diffs = Diff(cached, asked);
  ASSERT_EQ(diffs.size(), 2u);
  EXPECT_EQ(diffs[0].field, "tp_size");
  EXPECT_EQ(diffs[0].cached, "8");
  EXPECT_EQ(diffs[0].asked, "4");
  EXPECT_EQ(diffs[1].field, "dtype");
  EXPECT_EQ(diffs[1].cached, "bf16");
  EXPECT_EQ(diffs[1].asked, "fp16");
  EXPECT_EQ(FormatDiff(diffs), "tp_size: cached 8, asked 4; dtype: cached bf16, asked fp16");
}

TEST(Fingerprint, DiffOfFileOnlyOnOneSide) {
  FingerprintInputs cached = Sample();
  FingerprintInputs asked = Sample();
  asked.files.push_back({"extra.safetensors", 12, std::string(64, 'f')});
  std::vector<FieldDiff> diffs = Diff(cached, asked);
  ASSERT_EQ(diffs.size(), 1u);
  EXPECT_EQ(diffs[0].field, "files[extra.safetensors]");
  EXPECT_EQ(diffs[0].cached, "absent");
  EXPECT_EQ(diffs[0].asked, "size 12 content " + std::string(64, 'f'));
  EXPECT_NE(cached.Digest(), asked.Digest());

  // A renamed file: one absent on each side, in name order.
  FingerprintInputs renamed = Sample();
  renamed.files[0].name = "a.safetensors";
  diffs = Diff(cached, renamed);
  ASSERT_EQ(diffs.size(), 2u);
  EXPECT_EQ(diffs[0].field, "files[a.safetensors]");
  EXPECT_EQ(diffs[0].cached, "absent");
  EXPECT_EQ(diffs[1].field, "files[model-00002-of-00002.safetensors]");
  EXPECT_EQ(diffs[1].asked, "absent");
}

TEST(Fingerprint, FormatDiffAbbreviatesHashes) {
  FingerprintInputs cached = Sample();
  FingerprintInputs asked = Sample();
  asked.files[0].content = "0123456789abcdef" + std::string(48, '0');
  asked.revision = "";
  EXPECT_EQ(FormatDiff(Diff(cached, asked)),
            "revision: cached main, asked \"\"; "
            "files[model-00002-of-00002.safetensors].content: cached bbbbbbbbbbbb..., "
            "asked 0123456789ab...");
}

TEST(Fingerprint, FormatDiffKeepsFullHashWhenPrefixesMatch) {
  FieldDiff d{"quant_config_sha256", std::string(63, 'a') + "1", std::string(63, 'a') + "2"};
  EXPECT_EQ(FormatDiff({d}), "quant_config_sha256: cached " + d.cached + ", asked " + d.asked);
}

TEST(Fingerprint, EscapingPreventsForgedLines) {
  // Unescaped, both would encode as "architecture=x\nrevision=y\nrevision=\n".
  FingerprintInputs a;
  a.architecture = "x\nrevision=y";
  a.revision = "";
  FingerprintInputs b;
  b.architecture = "x";
  b.revision = "y\nrevision=";
  EXPECT_NE(a.Canonical(), b.Canonical());
  EXPECT_NE(a.Digest(), b.Digest());
  EXPECT_THAT(a.Canonical(), ::testing::HasSubstr("architecture=x%0Arevision%3Dy\n"));

  // Unescaped, one file whose header hash smuggles a second file's lines would encode exactly
  // like two files.
  FingerprintInputs c;
  c.files = {{"x", 1, "h1\nfile[y].size=2\nfile[y].content=h2"}};
  FingerprintInputs d;
  d.files = {{"x", 1, "h1"}, {"y", 2, "h2"}};
  EXPECT_NE(c.Canonical(), d.Canonical());
  EXPECT_NE(c.Digest(), d.Digest());

  // Same through a file name: "a].size=1\nfile[a" would close the bracket early.
  FingerprintInputs e;
  e.files = {{"a].size=1\nfile[a", 1, ""}};
  EXPECT_THAT(e.Canonical(), ::testing::HasSubstr("file[a%5D.size%3D1%0Afile%5Ba].size=1\n"));

  // The escape character itself is escaped: a literal "%0A" differs from "\n".
  FingerprintInputs f;
  f.env.engine = "a%0Ab";
  FingerprintInputs g;
  g.env.engine = "a\nb";
  EXPECT_NE(f.Digest(), g.Digest());
  EXPECT_THAT(f.Canonical(), ::testing::HasSubstr("engine=a%250Ab\n"));
}

// The engine tensor layout is encoded only when it is not "hf", so the golden digests above
// (from before the field existed) still hold; any other layout changes the digest.
TEST(Fingerprint, TensorLayoutOnlyEncodedWhenNotHf) {
  const FingerprintInputs base = Sample();
  FingerprintInputs empty = base;
  empty.tensor_layout = "";
  EXPECT_EQ(empty.Digest(), base.Digest());
  EXPECT_TRUE(Diff(base, empty).empty());
  EXPECT_EQ(base.Canonical().find("tensor_layout"), std::string::npos);
  std::set<std::string> digests = {base.Digest()};
  for (const char* layout : {"sglang", "vllm"}) {
    FingerprintInputs changed = base;
    changed.tensor_layout = layout;
    EXPECT_NE(changed.Canonical().find(std::string("tensor_layout=") + layout), std::string::npos);
    digests.insert(changed.Digest());
    std::vector<FieldDiff> diffs = Diff(base, changed);
    ASSERT_EQ(diffs.size(), 1u) << FormatDiff(diffs);
    EXPECT_EQ(FormatDiff(diffs), std::string("tensor_layout: cached hf, asked ") + layout);
  }
  EXPECT_EQ(digests.size(), 3u);
}

// A published entry's framework version and recipe are encoded only when set, so loaded
// entries keep their fingerprints; each changes the digest and is named by Diff.
TEST(Fingerprint, PublishFieldsOnlyEncodedWhenSet) {
  const FingerprintInputs base = Sample();
  EXPECT_EQ(base.Canonical().find("recipe"), std::string::npos);
  EXPECT_EQ(base.Canonical().find("framework_version"), std::string::npos);
  FingerprintInputs recipe = base;
  recipe.env.recipe = "fp8-blockscale-v3";
  FingerprintInputs framework = base;
  framework.env.framework_version = "torch 2.8.0";
  EXPECT_THAT(recipe.Canonical(), ::testing::HasSubstr("recipe=fp8-blockscale-v3\n"));
  EXPECT_THAT(framework.Canonical(), ::testing::HasSubstr("framework_version=torch 2.8.0\n"));
  const std::set<std::string> digests = {base.Digest(), recipe.Digest(), framework.Digest()};
  EXPECT_EQ(digests.size(), 3u);
  EXPECT_EQ(FormatDiff(Diff(recipe, base)), "recipe: cached fp8-blockscale-v3, asked \"\"");
  EXPECT_EQ(FormatDiff(Diff(base, framework)), "framework_version: cached \"\", asked torch 2.8.0");
}

// A private copy's namespace (spec isolation: namespace) is encoded only when set, so shared
// entries keep their fingerprints; two namespaces' copies differ, and Diff names the field.
TEST(Fingerprint, TenantOnlyEncodedWhenSet) {
  const FingerprintInputs shared = Sample();
  EXPECT_EQ(shared.Canonical().find("tenant"), std::string::npos);
  FingerprintInputs a = shared;
  a.env.tenant = "team-a";
  FingerprintInputs b = shared;
  b.env.tenant = "team-b";
  EXPECT_THAT(a.Canonical(), ::testing::HasSubstr("tenant=team-a\n"));
  const std::set<std::string> digests = {shared.Digest(), a.Digest(), b.Digest()};
  EXPECT_EQ(digests.size(), 3u);
  EXPECT_EQ(FormatDiff(Diff(a, b)), "tenant: cached team-a, asked team-b");
}

}  // namespace
}  // namespace weightcache::spec
