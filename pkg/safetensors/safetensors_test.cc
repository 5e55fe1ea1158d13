// File::Open: every malformed-header fault is refused with its code, file, tensor and
// fault named; valid files round-trip through WriteFile.
#include "pkg/safetensors/safetensors.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "pkg/safetensors/internal/test_util.h"
#include "pkg/safetensors/writer.h"
#include "tests/testutil/fifo.h"

namespace weightcache::safetensors {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;
using testing::TempDir;
using testing::WriteRaw;

std::string Msg(const absl::Status& s) { return std::string(s.message()); }

// Opens a file whose header is `header` (with `data` data bytes) and returns the status.
absl::Status OpenRaw(const TempDir& dir, std::string_view header, size_t data = 0,
                     const Limits& limits = {}) {
  const std::string path = dir.File("model.safetensors");
  WriteRaw(path, header, data);
  return File::Open(path, limits).status();
}

TEST(DTypeTest, NamesSizesAndParsing) {
  EXPECT_EQ(DTypeName(DType::kF8_E4M3), "F8_E4M3");
  EXPECT_EQ(DTypeSize(DType::kBF16), 2u);
  EXPECT_EQ(DTypeSize(DType::kF64), 8u);
  EXPECT_EQ(DTypeSize(DType::kBool), 1u);
  for (const char* name : {"BOOL", "U8", "I8", "F8_E4M3", "F8_E5M2", "I16", "U16", "F16", "BF16",
                           "I32", "U32", "F32", "I64", "U64", "F64"}) {
    auto d = ParseDType(name);
    ASSERT_TRUE(d.ok()) << name;
    EXPECT_EQ(DTypeName(*d), name);
  }
  auto bad = ParseDType("bf16");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(bad.status()), HasSubstr("unknown dtype 'bf16'"));
}

TEST(FileOpenTest, MissingFileIsNotFound) {
  TempDir dir;
  auto f = File::Open(dir.File("absent.safetensors"));
  EXPECT_EQ(f.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Msg(f.status()), HasSubstr("absent.safetensors"));
}

TEST(FileOpenTest, TruncatedFileShorterThanLengthField) {
  TempDir dir;
  const std::string path = dir.File("tiny.safetensors");
  testing::WriteBytes(path, std::string_view("\x05\0\0\0\0", 5));
  auto f = File::Open(path);
  EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(f.status()),
              AllOf(HasSubstr("tiny.safetensors"), HasSubstr("truncated"), HasSubstr("5 bytes")));
}

TEST(FileOpenTest, HeaderLengthBeyondFileSize) {
  TempDir dir;
  const std::string path = dir.File("model.safetensors");
  testing::WriteBytes(path, testing::LengthBytes(1000) + "{}        ");
  auto f = File::Open(path);
  EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(f.status()), AllOf(HasSubstr("model.safetensors"),
                                     HasSubstr("header length 1000 exceeds file size 18")));
}

TEST(FileOpenTest, HundredMegabyteHeaderRefusedUnparsed) {
  TempDir dir;
  const std::string path = dir.File("huge.safetensors");
  constexpr uint64_t kLen = 100ull << 20;
  // The length field says 100 MB and the file really is that long (sparse, all zeros, so
  // not JSON): the only way to get the limit error rather than a JSON error is to refuse
  // the header before reading or parsing it.
  testing::WriteBytes(path, testing::LengthBytes(kLen));
  ASSERT_EQ(::truncate(path.c_str(), static_cast<off_t>(8 + kLen)), 0);
  auto f = File::Open(path);
  EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(f.status()),
              AllOf(HasSubstr("huge.safetensors"), HasSubstr("header length 104857600"),
                    HasSubstr("exceeds the limit of 67108864"), HasSubstr("refused unread"),
                    Not(HasSubstr("JSON")), Not(HasSubstr("UTF-8"))));
}

TEST(FileOpenTest, SmallHeaderLimitIsEnforced) {
  TempDir dir;
  const std::string path = dir.File("model.safetensors");
  ASSERT_TRUE(WriteFile(path, {{"w", DType::kU8, {4}, {1, 2, 3, 4}}}).ok());
  ASSERT_TRUE(File::Open(path).ok());
  Limits small;
  small.max_header_bytes = 16;
  auto f = File::Open(path, small);
  EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(f.status()),
              AllOf(HasSubstr("model.safetensors"), HasSubstr("exceeds the limit of 16 bytes")));
}

TEST(FileOpenTest, TensorCountAndRankLimits) {
  TempDir dir;
  Limits limits;
  limits.max_tensors = 1;
  absl::Status s = OpenRaw(dir,
                           R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                           R"("b":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})",
                           2, limits);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(s), HasSubstr("above the limit of 1"));

  s = OpenRaw(dir, R"({"a":{"dtype":"U8","shape":[1,1,1,1,1,1,1,1,1],"data_offsets":[0,1]}})", 1);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(s), AllOf(HasSubstr("tensor 'a'"), HasSubstr("rank 9")));
}

TEST(FileOpenTest, InvalidUtf8) {
  TempDir dir;
  // A stray byte, an overlong '/', a UTF-16 surrogate and a code point above U+10FFFF.
  for (std::string bad : {"\xff", "\xc0\xaf", "\xed\xa0\x80", "\xf4\x90\x80\x80"}) {
    std::string header = "{\"__metadata__\":{\"k\":\"" + bad + "\"}}";
    absl::Status s = OpenRaw(dir, header);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(Msg(s), AllOf(HasSubstr("model.safetensors"), HasSubstr("not valid UTF-8"),
                              HasSubstr("offset 22")));
  }
  // Well-formed multi-byte text is fine.
  EXPECT_TRUE(
      OpenRaw(dir, "{\"__metadata__\":{\"k\":\"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\"}}").ok());
}

TEST(FileOpenTest, NotJson) {
  TempDir dir;
  absl::Status s = OpenRaw(dir, "{not json");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(s), AllOf(HasSubstr("model.safetensors: header"), HasSubstr("not valid JSON")));
}

TEST(FileOpenTest, JsonNotAnObject) {
  TempDir dir;
  absl::Status s = OpenRaw(dir, "[1, 2]");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(s), AllOf(HasSubstr("model.safetensors"),
                            HasSubstr("header is a JSON array, not an object")));
}

TEST(FileOpenTest, DuplicateKey) {
  TempDir dir;
  absl::Status s = OpenRaw(dir,
                           R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                           R"("w":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})",
                           2);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(s), AllOf(HasSubstr("model.safetensors"), HasSubstr("duplicate key 'w'")));
}

TEST(FileOpenTest, EntryKeysMustBeExactlyDtypeShapeOffsets) {
  TempDir dir;
  absl::Status s =
      OpenRaw(dir, R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"extra":1}})", 1);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(s), AllOf(HasSubstr("tensor 'w'"), HasSubstr("unexpected key 'extra'")));
  s = OpenRaw(dir, R"({"w":{"dtype":"U8","data_offsets":[0,1]}})", 1);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(s), AllOf(HasSubstr("tensor 'w'"), HasSubstr("missing key 'shape'")));
  s = OpenRaw(dir, R"({"w":[1,2]})", 1);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(s), AllOf(HasSubstr("tensor 'w'"), HasSubstr("not an object")));
}

TEST(FileOpenTest, UnknownDtype) {
  TempDir dir;
  absl::Status s = OpenRaw(dir, R"({"w":{"dtype":"F12","shape":[1],"data_offsets":[0,1]}})", 1);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(s), HasSubstr("model.safetensors: tensor 'w': unknown dtype 'F12'"));
}

TEST(FileOpenTest, NegativeShapeDimension) {
  TempDir dir;
  absl::Status s = OpenRaw(dir, R"({"w":{"dtype":"U8","shape":[2,-1],"data_offsets":[0,0]}})");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(s), HasSubstr("model.safetensors: tensor 'w': shape [2,-1] has negative "
                                "dimension -1"));
}

TEST(FileOpenTest, NonIntegerShapeDimension) {
  TempDir dir;
  for (const char* dim : {"2.5", "4.0", "\"4\"", "null", "1e30", "18446744073709551616"}) {
    absl::Status s = OpenRaw(
        dir, std::string(R"({"w":{"dtype":"U8","shape":[)") + dim + R"(],"data_offsets":[0,4]}})",
        4);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << dim;
    EXPECT_THAT(Msg(s),
                AllOf(HasSubstr("tensor 'w'"), HasSubstr("that is not a non-negative integer")))
        << dim;
  }
  absl::Status s = OpenRaw(dir, R"({"w":{"dtype":"U8","shape":7,"data_offsets":[0,7]}})", 7);
  EXPECT_THAT(Msg(s), AllOf(HasSubstr("tensor 'w'"), HasSubstr("shape 7 is not an array")));
}

TEST(FileOpenTest, ShapeProductOverflow) {
  TempDir dir;
  absl::Status s = OpenRaw(
      dir, R"({"w":{"dtype":"BF16","shape":[4294967296,4294967296],"data_offsets":[0,0]}})");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(s), AllOf(HasSubstr("tensor 'w'"), HasSubstr("overflows 64 bits")));
  // The element count fits but times the dtype size does not.
  s = OpenRaw(dir, R"({"w":{"dtype":"F64","shape":[4611686018427387904],"data_offsets":[0,0]}})");
  EXPECT_THAT(Msg(s), AllOf(HasSubstr("tensor 'w'"), HasSubstr("overflows 64 bits")));
}

TEST(FileOpenTest, SizeMismatch) {
  TempDir dir;
  absl::Status s = OpenRaw(dir,
                           R"({"model.layers.0.mlp.up_proj.weight":)"
                           R"({"dtype":"BF16","shape":[4,8],"data_offsets":[0,60]}})",
                           64);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(s), HasSubstr("model.safetensors: tensor 'model.layers.0.mlp.up_proj.weight': "
                                "shape [4,8] x BF16 = 64 bytes but data_offsets span 60"));
}

TEST(FileOpenTest, SpanOutsideFile) {
  TempDir dir;
  absl::Status s = OpenRaw(dir, R"({"w":{"dtype":"F32","shape":[16],"data_offsets":[0,64]}})", 32);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(s), AllOf(HasSubstr("model.safetensors: tensor 'w'"),
                            HasSubstr("end outside the file: data area is 32 bytes")));
}

TEST(FileOpenTest, BeginAfterEnd) {
  TempDir dir;
  absl::Status s = OpenRaw(dir, R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[8,0]}})", 8);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(s), HasSubstr("model.safetensors: tensor 'w': data_offsets [8,0] begin 8 > "
                                "end 0"));
  s = OpenRaw(dir, R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0,-1]}})", 8);
  EXPECT_THAT(Msg(s),
              AllOf(HasSubstr("tensor 'w'"), HasSubstr("not a pair of non-negative integers")));
}

TEST(FileOpenTest, OverlappingTensors) {
  TempDir dir;
  absl::Status s = OpenRaw(dir,
                           R"({"a":{"dtype":"U8","shape":[16],"data_offsets":[0,16]},)"
                           R"("b":{"dtype":"U8","shape":[16],"data_offsets":[8,24]}})",
                           24);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(s), AllOf(HasSubstr("model.safetensors"),
                            HasSubstr("tensors 'a' [0,16) and 'b' [8,24) overlap")));
  // Nested inside a larger tensor, seen after a small one: still an overlap.
  s = OpenRaw(dir,
              R"({"big":{"dtype":"U8","shape":[32],"data_offsets":[0,32]},)"
              R"("x":{"dtype":"U8","shape":[4],"data_offsets":[4,8]},)"
              R"("y":{"dtype":"U8","shape":[4],"data_offsets":[16,20]}})",
              32);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(s), HasSubstr("'big' [0,32) and 'x' [4,8) overlap"));
  // Touching tensors do not overlap.
  EXPECT_TRUE(OpenRaw(dir,
                      R"({"a":{"dtype":"U8","shape":[8],"data_offsets":[0,8]},)"
                      R"("b":{"dtype":"U8","shape":[8],"data_offsets":[8,16]}})",
                      16)
                  .ok());
}

// The reference reader's rule (InvalidOffset, MetadataIncompleteBuffer): every data byte
// belongs to a tensor. Bytes after the last tensor, or between two, were accepted: they
// entered the content digest (the identity) without being anything a client maps.
TEST(FileOpenTest, BytesThatBelongToNoTensorAreRefused) {
  TempDir dir;
  constexpr char kA[] = R"("a":{"dtype":"U8","shape":[8],"data_offsets":[0,8]})";
  const struct {
    std::string header;
    size_t data;
    std::string refusal;  // empty: accepted
  } cases[] = {
      {absl::StrCat("{", kA, "}"), 11,
       "model.safetensors: 3 bytes after the last tensor ('a' ends at 8 of the data area's 11) "
       "belong to no tensor"},
      {R"({"__metadata__":{"format":"pt"}})", 1,
       "model.safetensors: 1 bytes after the last tensor belong to no tensor"},
      {absl::StrCat("{", kA, R"(,"b":{"dtype":"U8","shape":[8],"data_offsets":[12,20]}})"), 20,
       "model.safetensors: data bytes [8,12) belong to no tensor (between 'a' and 'b')"},
      {R"({"a":{"dtype":"U8","shape":[8],"data_offsets":[4,12]}})", 12,
       "data bytes [0,4) belong to no tensor (before the first, 'a')"},
      // The reference writer pads the header with spaces to 8-byte alignment: that is header,
      // and accepted; so is a data area covered exactly, in any header order.
      {absl::StrCat(R"({"b":{"dtype":"U8","shape":[8],"data_offsets":[8,16]},)", kA, "}     "), 16,
       ""},
  };
  for (const auto& c : cases) {
    const absl::Status s = OpenRaw(dir, c.header, c.data);
    if (c.refusal.empty()) {
      EXPECT_TRUE(s.ok()) << c.header << ": " << s;
    } else {
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.header;
      EXPECT_THAT(Msg(s), HasSubstr(c.refusal));
    }
  }
}

TEST(FileOpenTest, BadMetadata) {
  TempDir dir;
  absl::Status s = OpenRaw(dir, R"({"__metadata__":{"format":"pt","step":1}})");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(s), HasSubstr("model.safetensors: __metadata__ value of 'step' is a JSON "
                                "number, not a string"));
  s = OpenRaw(dir, R"({"__metadata__":"pt"})");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(s), HasSubstr("model.safetensors: __metadata__ is a JSON string"));
}

TEST(FileOpenTest, RoundTripThroughWriteFile) {
  TempDir dir;
  const std::string path = dir.File("model.safetensors");
  std::vector<TensorData> in = {
      {"z.first", DType::kBF16, {3, 5}, testing::Pattern(30, 1)},
      {"a.second", DType::kF32, {7}, testing::Pattern(28, 2)},
      {"scalar", DType::kF8_E4M3, {}, testing::Pattern(1, 3)},
      {"m.bool", DType::kBool, {2, 2, 2}, testing::Pattern(8, 4)},
  };
  ASSERT_TRUE(WriteFile(path, in, {{"format", "pt"}, {"note", "round trip"}}).ok());

  auto file = File::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  const FileInfo& info = file->info();
  EXPECT_EQ(info.name, "model.safetensors");
  EXPECT_EQ(info.path, path);
  EXPECT_EQ(info.data_offset % 8, 0u);  // header padded like the reference implementation
  EXPECT_EQ(info.size, info.data_offset + 30 + 28 + 1 + 8);
  EXPECT_EQ(info.metadata.at("format"), "pt");
  EXPECT_EQ(info.metadata.at("note"), "round trip");
  ASSERT_EQ(file->tensors().size(), in.size());

  // Laid out contiguously in the given order; tensors() is sorted by offset, so it is
  // that same order.
  uint64_t offset = info.data_offset;
  std::vector<ReadRequest> reads;
  std::vector<std::vector<uint8_t>> out(in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    const TensorInfo& t = file->tensors()[i];
    EXPECT_EQ(t.name, in[i].name);
    EXPECT_EQ(t.dtype, in[i].dtype);
    EXPECT_EQ(t.shape, in[i].shape);
    EXPECT_EQ(t.file_offset, offset) << t.name;
    EXPECT_EQ(t.nbytes, in[i].bytes.size());
    EXPECT_EQ(t.numel() * DTypeSize(t.dtype), t.nbytes);
    EXPECT_EQ(t.file_index, 0u);
    offset += t.nbytes;
    out[i].resize(t.nbytes);
    reads.push_back({file->fd(), t.file_offset, t.nbytes, out[i].data(), t.name});
  }
  ASSERT_TRUE(ReadRanges(reads, {}).ok());
  for (size_t i = 0; i < in.size(); ++i) EXPECT_EQ(out[i], in[i].bytes) << in[i].name;
}

TEST(FileOpenTest, EmptyHeaderHasNoTensors) {
  TempDir dir;
  ASSERT_TRUE(OpenRaw(dir, "{}      ").ok());
  auto f = File::Open(dir.File("model.safetensors"));
  ASSERT_TRUE(f.ok());
  EXPECT_TRUE(f->tensors().empty());
  EXPECT_EQ(f->info().data_offset, 16u);
}

std::string Sha256OfPrefix(const std::string& path, size_t n) {
  std::string bytes(n, '\0');
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  EXPECT_EQ(::pread(fd, bytes.data(), n, 0), static_cast<ssize_t>(n));
  ::close(fd);
  unsigned char md[32];
  unsigned int len = 0;
  EVP_Digest(bytes.data(), bytes.size(), md, &len, EVP_sha256(), nullptr);
  std::string hex;
  for (unsigned int i = 0; i < len; ++i) {
    static constexpr char kHex[] = "0123456789abcdef";
    hex += kHex[md[i] >> 4];
    hex += kHex[md[i] & 15];
  }
  return hex;
}

TEST(FileOpenTest, HeaderSha256StableAndHeaderSensitive) {
  TempDir dir;
  const std::string a = dir.File("a.safetensors");
  const std::string b = dir.File("b.safetensors");
  const std::string c = dir.File("c.safetensors");
  ASSERT_TRUE(WriteFile(a, {{"w", DType::kU8, {4}, {1, 2, 3, 4}}}).ok());
  // Same header, different data: same digest (it covers the header only).
  ASSERT_TRUE(WriteFile(b, {{"w", DType::kU8, {4}, {9, 9, 9, 9}}}).ok());
  // Different header.
  ASSERT_TRUE(WriteFile(c, {{"w", DType::kU8, {2, 2}, {1, 2, 3, 4}}}).ok());

  auto fa = File::Open(a);
  auto fa2 = File::Open(a);
  auto fb = File::Open(b);
  auto fc = File::Open(c);
  ASSERT_TRUE(fa.ok() && fa2.ok() && fb.ok() && fc.ok());
  const std::string& ha = fa->info().header_sha256;
  EXPECT_EQ(ha.size(), 64u);
  EXPECT_EQ(ha, Sha256OfPrefix(a, fa->info().data_offset));  // 8 length bytes + header
  EXPECT_EQ(ha, fa2->info().header_sha256);
  EXPECT_EQ(ha, fb->info().header_sha256);
  EXPECT_NE(ha, fc->info().header_sha256);
}

TEST(FileOpenTest, TensorBeyondFourGiBInSparseFile) {
  TempDir dir;
  const std::string path = dir.File("big.safetensors");
  constexpr uint64_t kBegin = 5ull << 30;
  constexpr uint64_t kLen = 4096;
  // A 5 GiB tensor before it (every data byte belongs to a tensor), never read.
  const std::string header =
      "{\"big\":{\"dtype\":\"U8\",\"shape\":[4096],\"data_offsets\":[" + std::to_string(kBegin) +
      "," + std::to_string(kBegin + kLen) + "]},\"before\":{\"dtype\":\"U8\",\"shape\":[" +
      std::to_string(kBegin) + "],\"data_offsets\":[0," + std::to_string(kBegin) + "]}}";
  testing::WriteRaw(path, header);
  const uint64_t data_offset = 8 + header.size();
  const std::vector<uint8_t> pattern = testing::Pattern(kLen, 99);
  {
    const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
    ASSERT_GE(fd, 0);
    // Sparse: only the header and the last 4 KiB hold blocks.
    ASSERT_EQ(::ftruncate(fd, static_cast<off_t>(data_offset + kBegin + kLen)), 0);
    ASSERT_EQ(::pwrite(fd, pattern.data(), kLen, static_cast<off_t>(data_offset + kBegin)),
              static_cast<ssize_t>(kLen));
    ::close(fd);
  }
  auto file = File::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  ASSERT_EQ(file->tensors().size(), 2u);
  const TensorInfo& t = file->tensors()[1];  // in offset order
  EXPECT_EQ(t.name, "big");
  EXPECT_EQ(t.file_offset, data_offset + kBegin);
  EXPECT_GT(t.file_offset, 4ull << 30);
  EXPECT_EQ(t.nbytes, kLen);
  std::vector<uint8_t> out(kLen);
  ASSERT_TRUE(
      ReadRanges({{file->fd(), t.file_offset, t.nbytes, out.data(), "big"}}, {4, 1000}).ok());
  EXPECT_EQ(out, pattern);
}

TEST(FileOpenTest, DirectoryIsNotARegularFile) {
  TempDir dir;
  auto f = File::Open(dir.path());
  EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(f.status()), HasSubstr("not a regular file"));
}

// Issue 13 #4: a [0, 512] embedding was accepted and a vocab-parallel split of it divided
// by zero in the planner (SIGFPE). Empty tensors are refused where they enter.
TEST(FileOpenTest, ZeroSizedDimensionIsRefused) {
  TempDir dir;
  absl::Status s = OpenRaw(
      dir,
      R"({"model.embed_tokens.weight":{"dtype":"BF16","shape":[0,512],"data_offsets":[0,0]}})");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(s), HasSubstr("model.safetensors: tensor 'model.embed_tokens.weight': shape "
                                "[0,512] has a zero-sized dimension (empty tensors are not "
                                "served)"));
  s = OpenRaw(dir, R"({"w":{"dtype":"F32","shape":[4,0],"data_offsets":[0,0]}})");
  EXPECT_THAT(Msg(s), HasSubstr("tensor 'w': shape [4,0] has a zero-sized dimension"));
}

// Issue 14: "q_proj.weight\u0000x" was accepted; a C-string reader sees "q_proj.weight".
TEST(FileOpenTest, TensorNameWithNulOrControlCharacterIsRefused) {
  TempDir dir;
  absl::Status s = OpenRaw(dir,
                           R"({"model.layers.0.self_attn.q_proj.weight\u0000x":)"
                           R"({"dtype":"U8","shape":[4],"data_offsets":[0,4]}})",
                           4);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(s), HasSubstr("model.safetensors: tensor "
                                "'model.layers.0.self_attn.q_proj.weight\\000x': name holds "
                                "control character U+0000 at byte 38"));
  for (const char* name : {R"(a\nb)", R"(a\tb)", R"(\u007f)", R"(a\u0085)", R"(\u001b[31m)"}) {
    s = OpenRaw(
        dir, absl::StrCat(R"({")", name, R"(":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})"),
        4);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << name;
    EXPECT_THAT(Msg(s), HasSubstr("name holds control character")) << name;
  }
  // Printable non-ASCII stays valid.
  EXPECT_TRUE(
      OpenRaw(dir, R"({"w\u00e9":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})", 4).ok());
}

TEST(FileOpenTest, OverlongTensorNameIsRefusedAndQuotedCut) {
  TempDir dir;
  const std::string name(5000, 'n');
  absl::Status s = OpenRaw(
      dir, absl::StrCat(R"({")", name, R"(":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})"), 4);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(s), HasSubstr("...': name is 5000 bytes, above the limit of 1024"));
  EXPECT_LT(Msg(s).size(), 400u);
}

TEST(FileOpenTest, DeeplyNestedHeaderIsRefusedUnparsed) {
  TempDir dir;
  const std::string deep = R"({"__metadata__":)" + std::string(100000, '[');
  absl::Status s = OpenRaw(dir, deep);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(s), HasSubstr("model.safetensors: header nests arrays/objects deeper than 32 "
                                "levels (refused unparsed)"));
}

TEST(FileOpenTest, FifoFailsAtOnceNamingIt) {
  TempDir dir;
  ::weightcache::testing::FifoGuard fifo(dir.File("model.safetensors"));
  ASSERT_TRUE(fifo.made());
  auto f = File::Open(dir.File("model.safetensors"));
  EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(f.status()), HasSubstr("model.safetensors: is a FIFO, not a regular file"));
  EXPECT_FALSE(fifo.fired()) << "File::Open blocked on the FIFO";
}

}  // namespace
}  // namespace weightcache::safetensors
