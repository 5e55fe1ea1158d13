// The keeper record codec (keeper_record.h): what a daemon deposits decodes back to the same
// identity, manifest and files; a record whose fingerprint inputs do not give its
// fingerprint, a tensor outside its segments, another format or bytes that do not parse are
// refused naming what is wrong (the adopting daemon then drops the entry and loads again).
#include "pkg/server/keeper/keeper_record.h"

#include <memory>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "pkg/integrity/crypto_digest.h"
#include "pkg/memory/backend.h"

namespace weightcache::server {
namespace {

struct Fixture {
  std::unique_ptr<memory::Backend> backend = memory::MakeHostBackend();
  std::unique_ptr<cache::Entry> entry;
  load::LoadedModel content;

  Fixture() {
    spec::FingerprintInputs in;
    in.architecture = "LlamaForCausalLM";
    in.files.push_back({"model.safetensors", 4096, "sha256:abc"});
    in.layout = {2, 1, 1, 0};
    in.dtype = "bf16";
    in.env.compute_capability = "9.0";
    load::SourceFile f;
    f.name = "model.safetensors";
    f.path = "/models/m/model.safetensors";
    f.stat = {1, 2, 4096, 3, 4};
    f.digest = "sha256:abc";
    entry = std::make_unique<cache::Entry>(cache::Key{in.Digest(), "host"}, "m", in, "disk",
                                           std::vector<load::SourceFile>{f});
    auto seg = backend->Allocate("", 1 << 20, "record test");
    EXPECT_TRUE(seg.ok()) << seg.status();
    content.segments.push_back(std::move(seg).value());
    content.model_dir = "/models/m";
    content.device_uuid = "host";
    content.plan.segment_bytes = {8192};
    content.plan.total_bytes = 8192;
    load::PlannedTensor t;
    t.name = "model.norm.weight";
    t.dtype = safetensors::DType::kBF16;
    t.shape = {4096};
    t.strides = {1};
    t.segment = 0;
    t.offset = 0;
    t.nbytes = 8192;
    content.plan.tensors.push_back(t);
    memory::Segment& s0 = *content.segments[0];
    digests.push_back({{7}, integrity::CryptoDigestHost(s0.host_data(), s0.size())});
  }
  // The segment's digests as the registry takes them at fill.
  std::vector<integrity::SegmentDigest> digests;
  std::string Encode() const {
    return EncodeKeeperRecord(*entry, content, "host", RecordedSpec{"name: m\n", true}, nullptr,
                              &digests);
  }
};

TEST(KeeperRecordTest, WhatIsDepositedDecodesToTheSameEntry) {
  Fixture f;
  auto a = DecodeKeeperRecord(f.Encode());
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->record.model(), "m");
  EXPECT_EQ(a->record.fingerprint(), f.entry->fingerprint);
  EXPECT_EQ(a->inputs.Digest(), f.entry->fingerprint);
  EXPECT_EQ(a->record.spec_yaml(), "name: m\n");
  EXPECT_TRUE(a->record.defined_inline());
  ASSERT_EQ(a->files.size(), 1u);
  EXPECT_EQ(a->files[0].path, "/models/m/model.safetensors");
  EXPECT_EQ(a->files[0].stat.ino, 2u);
  EXPECT_EQ(a->files[0].digest_source, identity::DigestSource::kHashed);
  ASSERT_EQ(a->plan.tensors.size(), 1u);
  EXPECT_EQ(a->plan.tensors[0].name, "model.norm.weight");
  EXPECT_EQ(a->plan.tensors[0].nbytes, 8192u);
  EXPECT_EQ(a->record.segment_sizes_size(), 1);
  EXPECT_EQ(KeeperKey(f.entry->fingerprint, "host"), f.entry->fingerprint + "@host");
}

// The record says how the bytes were first filled, not how this daemon got them: a copy
// adopted from the keeper and deposited again still says "disk" (a peer's quorum counts only
// such copies), and one pulled from a peer says so.
TEST(KeeperRecordTest, LaunderedOriginSurvivesARedepositAfterAdoption) {
  Fixture f;
  f.content.origin = "disk";  // what the adoption sets from the record it took back
  f.entry =
      std::make_unique<cache::Entry>(f.entry->key, "m", f.entry->inputs, "keeper", f.entry->files);
  auto a = DecodeKeeperRecord(f.Encode());
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->record.source(), "disk");
  f.content.origin = "peer_fill";
  a = DecodeKeeperRecord(f.Encode());
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->record.source(), "peer_fill");
}

// A private copy's namespace is part of its fingerprint: the record keeps it, so the adopted
// entry is still that namespace's alone.
TEST(KeeperRecordTest, APrivateCopysNamespaceSurvivesTheRecord) {
  Fixture f;
  spec::FingerprintInputs in = f.entry->inputs;
  in.env.tenant = "team-a";
  f.entry = std::make_unique<cache::Entry>(cache::Key{in.Digest(), "host"}, "m", in, "disk",
                                           f.entry->files);
  auto a = DecodeKeeperRecord(f.Encode());
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->record.tenant(), "team-a");
  EXPECT_EQ(a->inputs.env.tenant, "team-a");
  EXPECT_EQ(a->inputs.Digest(), f.entry->fingerprint);
}

// Issue 48: the record carries each segment's cryptographic digest, and the adoption check
// compares those, naming the segment and both digests. The scrub digest is not part of it:
// the adopting daemon drew another key, so its scrub values differ for the same bytes.
TEST(KeeperRecordTest, TheCryptographicDigestsAtDepositAreCheckedAtAdoption) {
  Fixture f;
  auto a = DecodeKeeperRecord(f.Encode());
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_EQ(a->record.segment_sha256_size(), 1);
  EXPECT_EQ(a->record.segment_sha256(0), f.digests[0].sha256);
  auto check = AdoptionDigestCheck(a->record);
  ASSERT_TRUE(check);
  EXPECT_TRUE(check(f.digests).ok());
  auto rekeyed = f.digests;  // the same bytes, digested by a daemon with another key
  rekeyed[0].chunks[0] ^= 0x1234;
  EXPECT_TRUE(check(rekeyed).ok());
  auto changed = f.digests;
  changed[0].sha256[5] ^= 1;
  const absl::Status st = check(changed);
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(
      std::string(st.message()),
      ::testing::HasSubstr("segment(s) 0 (" + integrity::CryptoDigestText(changed[0].sha256) +
                           " where the record has " +
                           integrity::CryptoDigestText(f.digests[0].sha256) + ")"));
  auto scrub_only = f.digests;  // a digest without its cryptographic part vouches for nothing
  scrub_only[0].sha256.clear();
  EXPECT_EQ(check(scrub_only).code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(check({}).code(), absl::StatusCode::kDataLoss);
}

// A record without a cryptographic digest per segment (one deposited without digests, or of
// issue 27's format with public-key folds) is refused, not adopted unchecked.
TEST(KeeperRecordTest, ARecordWithoutCryptographicDigestsIsRefused) {
  Fixture f;
  auto none = DecodeKeeperRecord(
      EncodeKeeperRecord(*f.entry, f.content, "host", RecordedSpec{"name: m\n", true}));
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(none.status().message()),
              ::testing::HasSubstr("0 cryptographic digests for 1 segments"));
  v1::KeeperRecord r;
  ASSERT_TRUE(r.ParseFromString(f.Encode()));
  r.set_segment_sha256(0, "short");
  EXPECT_FALSE(DecodeKeeperRecord(r.SerializeAsString()).ok());
  r.set_format(1);  // issue 27's records
  auto old = DecodeKeeperRecord(r.SerializeAsString());
  ASSERT_FALSE(old.ok());
  EXPECT_THAT(std::string(old.status().message()),
              ::testing::HasSubstr("keeper record format 1; this daemon reads format 2"));
}

// A file named by the spec's pin (not read on that node) stays "pinned" through the record;
// it used to come back "hashed", claiming a read that never happened.
TEST(KeeperRecordTest, APinnedDigestSourceSurvivesTheRecord) {
  Fixture f;
  std::vector<load::SourceFile> files = f.entry->files;
  files[0].digest_source = identity::DigestSource::kPinned;
  f.entry = std::make_unique<cache::Entry>(cache::Key{f.entry->fingerprint, "host"}, "m",
                                           f.entry->inputs, "disk", files);
  auto a = DecodeKeeperRecord(f.Encode());
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_EQ(a->files.size(), 1u);
  EXPECT_EQ(a->files[0].digest_source, identity::DigestSource::kPinned);
}

TEST(KeeperRecordTest, ARecordWhoseInputsDoNotGiveItsFingerprintIsRefused) {
  Fixture f;
  v1::KeeperRecord r;
  ASSERT_TRUE(r.ParseFromString(f.Encode()));
  r.set_dtype("fp8");  // the bytes claim another identity than the fingerprint says
  auto a = DecodeKeeperRecord(r.SerializeAsString());
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(a.status().message().find("fingerprint inputs give"), std::string::npos) << a.status();
}

TEST(KeeperRecordTest, ATensorOutsideItsSegmentsIsRefused) {
  Fixture f;
  // Runs past the end of its segment.
  f.content.plan.tensors[0].offset = f.content.segments[0]->size() - 100;
  auto a = DecodeKeeperRecord(f.Encode());
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.status().message().find("tensor model.norm.weight"), std::string::npos) << a.status();
  EXPECT_NE(a.status().message().find("lies outside"), std::string::npos) << a.status();
}

TEST(KeeperRecordTest, AnotherFormatOrBytesThatDoNotParseAreRefused) {
  Fixture f;
  v1::KeeperRecord r;
  ASSERT_TRUE(r.ParseFromString(f.Encode()));
  r.set_format(99);
  auto other = DecodeKeeperRecord(r.SerializeAsString());
  EXPECT_NE(other.status().message().find("keeper record format 99"), std::string::npos)
      << other.status();
  auto junk = DecodeKeeperRecord(std::string("\xff\xff\xff\xff junk", 9));
  EXPECT_EQ(junk.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(junk.status().message().find("does not parse"), std::string::npos) << junk.status();
}

}  // namespace
}  // namespace weightcache::server
