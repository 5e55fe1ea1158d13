#include "pkg/server/messages/manifest.h"

#include "gtest/gtest.h"

namespace weightcache::server {
namespace {

std::shared_ptr<const load::LoadedModel> Model(const std::string& first_name) {
  auto m = std::make_shared<load::LoadedModel>();
  load::PlannedTensor t;
  t.name = first_name;
  t.dtype = safetensors::DType::kBF16;
  t.shape = {4, 8};
  t.strides = {8, 1};
  t.segment = 0;
  t.offset = 256;
  t.nbytes = 64;
  m->plan.tensors.push_back(t);
  t.name = "z.weight";
  t.offset = 512;
  m->plan.tensors.push_back(t);
  t.name = "fused.weight";  // a view over both
  t.shape = {8, 8};
  t.offset = 256;
  t.nbytes = 128;
  m->plan.views.push_back(t);
  return m;
}

TEST(Manifest, HoldsTheTensorsThenTheViewsAsTheWireNamesThem) {
  auto content = Model("a.weight");
  v1::TensorManifest m;
  ASSERT_TRUE(m.ParseFromString(SerializeManifest(*content)));
  ASSERT_EQ(m.tensors_size(), 3);
  EXPECT_EQ(m.tensors(0).name(), "a.weight");
  EXPECT_EQ(m.tensors(1).name(), "z.weight");
  EXPECT_EQ(m.tensors(2).name(), "fused.weight");
  EXPECT_EQ(m.tensors(0).dtype(), "BF16");
  EXPECT_EQ(std::vector<int64_t>(m.tensors(0).shape().begin(), m.tensors(0).shape().end()),
            (std::vector<int64_t>{4, 8}));
  EXPECT_EQ(std::vector<int64_t>(m.tensors(0).strides().begin(), m.tensors(0).strides().end()),
            (std::vector<int64_t>{8, 1}));
  EXPECT_EQ(m.tensors(1).offset(), 512u);
  EXPECT_EQ(m.tensors(2).nbytes(), 128u);
}

TEST(ManifestCache, BuildsOncePerContentAndForgetsFreedContent) {
  ManifestCache cache;
  auto a = Model("a.weight");
  auto first = cache.Get(a);
  EXPECT_EQ(cache.Get(a), first);  // the same bytes, not rebuilt
  auto b = Model("b.weight");
  auto second = cache.Get(b);
  EXPECT_NE(*second, *first);
  EXPECT_EQ(cache.size_for_test(), 2u);
  // A freed content's bytes go with the next insertion; whoever still holds them keeps them.
  a.reset();
  auto c = Model("c.weight");
  v1::TensorManifest m;
  ASSERT_TRUE(m.ParseFromString(*cache.Get(c)));
  EXPECT_EQ(m.tensors(0).name(), "c.weight");
  EXPECT_EQ(cache.size_for_test(), 2u);
  ASSERT_TRUE(m.ParseFromString(*first));
  EXPECT_EQ(m.tensors(0).name(), "a.weight");
}

}  // namespace
}  // namespace weightcache::server
