// The AOTInductor artifact and its key as a C++ engine reads them: the bytes Python's writer
// (weightcache.aoti.pack) made, and the marker name Python's json.dumps gives a key.
#include "pkg/client/aoti_artifact.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "absl/strings/escaping.h"
#include "proto/weightcache/v1/weightcache.pb.h"

namespace weightcache::client {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Pair;

// /usr/bin/python3 (python/): weightcache.aoti.pack(b"PK\x03\x04package",
//   {"m.layers.0.w": "layers.0.w", "m.embed": "embed"},
//   {"m.inv_freq": torch.arange(4, dtype=torch.float32),
//    "m.mask": torch.tensor([[1, 0], [0, 1]], dtype=torch.int64)}).hex()
constexpr char kPythonBlobHex[] =
    "5743414f5449303117010000000000007b22666f726d6174223a20312c20227061636b6167655f6279746573"
    "223a2031312c202262696e64696e6773223a207b226d2e656d626564223a2022656d626564222c20226d2e6c"
    "61796572732e302e77223a20226c61796572732e302e77227d2c2022636f6e7374616e7473223a205b7b2266"
    "716e223a20226d2e696e765f66726571222c20226474797065223a2022666c6f61743332222c202273686170"
    "65223a205b345d2c20226f6666736574223a20302c20226e6279746573223a2031367d2c207b2266716e223a"
    "20226d2e6d61736b222c20226474797065223a2022696e743634222c20227368617065223a205b322c20325d"
    "2c20226f6666736574223a2031362c20226e6279746573223a2033327d5d7d504b03047061636b6167650000"
    "00000000803f000000400000404001000000000000000000000000000000000000000000000001000000000000"
    "00";

std::string PythonBlob() { return absl::HexStringToBytes(kPythonBlobHex); }

TEST(AotiArtifact, ReadsWhatPythonsWriterWrote) {
  const std::string blob = PythonBlob();
  auto a = ParseAotiArtifact(blob);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->package, std::string("PK\x03\x04package", 11));
  EXPECT_THAT(a->bindings,
              ElementsAre(Pair("m.embed", "embed"), Pair("m.layers.0.w", "layers.0.w")));
  ASSERT_EQ(a->constants.size(), 2u);
  EXPECT_EQ(a->constants[0].fqn, "m.inv_freq");
  EXPECT_EQ(a->constants[0].dtype, "float32");
  EXPECT_THAT(a->constants[0].shape, ElementsAre(4));
  ASSERT_EQ(a->constants[0].bytes.size(), 16u);
  float f[4];
  std::memcpy(f, a->constants[0].bytes.data(), sizeof f);
  EXPECT_THAT(f, ElementsAre(0.0f, 1.0f, 2.0f, 3.0f));
  EXPECT_EQ(a->constants[1].dtype, "int64");
  EXPECT_THAT(a->constants[1].shape, ElementsAre(2, 2));
  EXPECT_EQ(a->constants[1].bytes.size(), 32u);
}

TEST(AotiArtifact, EveryTruncationIsRefusedNamingWhatIsMissing) {
  const std::string blob = PythonBlob();
  for (size_t n = 0; n < blob.size(); ++n) {
    auto a = ParseAotiArtifact(std::string_view(blob).substr(0, n));
    ASSERT_FALSE(a.ok()) << n << " bytes";
    EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(a.status().message()), HasSubstr("AOTInductor artifact: "));
  }
  EXPECT_THAT(std::string(ParseAotiArtifact("PK\x03\x04 a bare .pt2").status().message()),
              HasSubstr("without the WCAOTI01 header"));
  EXPECT_THAT(std::string(ParseAotiArtifact(blob.substr(0, blob.size() - 1)).status().message()),
              HasSubstr("constant m.mask (int64, 32 bytes at 16) lies outside the blob"));
  std::string other = blob;
  other.replace(other.find("\"format\": 1"), 11, "\"format\": 7");
  EXPECT_THAT(std::string(ParseAotiArtifact(other).status().message()),
              HasSubstr("format 7, this reader reads 1"));
}

TEST(AotiArtifactKey, ReadsTheKeyPythonPrintsAndRefusesOthersNamingTheField) {
  auto k = ParseArtifactKeyJson(
      R"({"kind": "aoti-package", "model": "m", "fingerprint": "fp", "torch_version": "2.11.0"})",
      "key.json");
  ASSERT_TRUE(k.ok()) << k.status();
  EXPECT_EQ(k->kind(), "aoti-package");
  EXPECT_EQ(k->fingerprint(), "fp");
  EXPECT_EQ(k->torch_version(), "2.11.0");
  auto unknown = ParseArtifactKeyJson(R"({"kind": "k", "model": "m", "shape": "1x2"})", "key.json");
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(unknown.status().message()),
              HasSubstr("key.json: unknown field(s) shape"));
  auto number = ParseArtifactKeyJson(R"({"kind": "k", "model": 3})", "key.json");
  EXPECT_THAT(std::string(number.status().message()), HasSubstr("not strings: model (number)"));
  EXPECT_THAT(std::string(ParseArtifactKeyJson("[1]", "key.json").status().message()),
              HasSubstr("key.json: an artifact key is a JSON object, not array"));
  EXPECT_THAT(std::string(ParseArtifactKeyJson(R"({"kind": "k"})", "key.json").status().message()),
              HasSubstr("model is missing"));
}

// The marker of a load is named by sha256(json.dumps(key, sort_keys=True)): C++ must write
// the very text Python does, escapes and all (from /usr/bin/python3's json.dumps).
TEST(AotiArtifactKey, PythonJsonIsWhatPythonsJsonDumpsWrites) {
  v1::ArtifactKey key;
  key.set_kind("aoti-package");
  key.set_model("llama-\xC3\xA9\"\\\n\xF0\x9D\x84\x9E");  // é, a quote, a backslash, 𝄞
  key.set_fingerprint("fp1");
  key.set_engine_version("code-0123456789abcdef");
  key.set_torch_version("2.11.0+cu130");
  key.set_triton_version("3.6.0");
  key.set_cuda_version("13.0");
  key.set_compute_capability("9.0");
  key.set_settings_hash("abababababababababababababababab");
  EXPECT_EQ(ArtifactKeyPythonJson(key),
            R"({"compute_capability": "9.0", "cuda_version": "13.0", "engine": "", )"
            R"("engine_version": "code-0123456789abcdef", "fingerprint": "fp1", )"
            R"("kind": "aoti-package", "model": "llama-\u00e9\"\\\n\ud834\udd1e", )"
            R"("settings_hash": "abababababababababababababababab", "torch_version": )"
            R"("2.11.0+cu130", "triton_version": "3.6.0"})");
}

}  // namespace
}  // namespace weightcache::client
