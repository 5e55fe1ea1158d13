// The libtorch adapter on the host backend (runs anywhere libtorch is found): a daemon in
// this process serves a checkpoint of mixed dtypes; ToTorch must give zero-copy CPU tensors
// with the file's bytes, dtypes, shapes and strides, and keep the lease alive until the
// last tensor dies.
#include "pkg/client/torch/torch_adapter.h"

#include <gtest/gtest.h>
#include <torch/version.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <thread>

#include "pkg/memory/backend.h"
#include "pkg/safetensors/writer.h"
#include "pkg/server/daemon.h"
#include "tests/testutil/temp_dir.h"
#include "weightcache/v1/weightcache.pb.h"

namespace weightcache::client {
namespace {

using namespace std::chrono_literals;
using safetensors::DType;

template <typename T>
std::vector<uint8_t> Bytes(const std::vector<T>& v) {
  std::vector<uint8_t> b(v.size() * sizeof(T));
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

class TorchAdapterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string dir = tmp_ / "m";
    std::filesystem::create_directories(dir);
    std::ofstream(dir + "/config.json")
        << R"({"architectures":["LlamaForCausalLM"],"torch_dtype":"float32"})";
    std::vector<float> f32(3 * 5);
    for (size_t i = 0; i < f32.size(); ++i) f32[i] = 0.25f * static_cast<float>(i) - 1.0f;
    std::vector<int64_t> i64 = {-3, 1ll << 40, 7, 0};
    std::vector<uint8_t> u8 = {1, 2, 3, 250, 251, 252};
    std::vector<uint16_t> bf16 = {0x3f80, 0x4000, 0xbf80, 0x0000};  // 1, 2, -1, 0
    std::vector<uint8_t> boolean = {1, 0, 1};
    tensors_ = {{"model.a.weight", DType::kF32, {3, 5}, Bytes(f32)},
                {"model.b.index", DType::kI64, {4}, Bytes(i64)},
                {"model.c.bytes", DType::kU8, {2, 3}, u8},
                {"model.d.weight", DType::kBF16, {2, 2}, Bytes(bf16)},
                {"model.e.mask", DType::kBool, {3}, boolean}};
    ASSERT_TRUE(safetensors::WriteFile(dir + "/model.safetensors", tensors_).ok());
    f32_sum_ = 0;
    for (float x : f32) f32_sum_ += x;

    backend_ = memory::MakeHostBackend();
    server::DaemonOptions o;
    o.socket_dir = tmp_ / "s";
    spec::ModelSpec s;
    s.name = "mixed";
    s.model_dir = dir;
    o.specs = {s};
    auto d = server::Daemon::Start(o, backend_.get());
    ASSERT_TRUE(d.ok()) << d.status();
    daemon_ = std::move(d).value();
    auto c = Client::Connect(o.socket_dir);
    ASSERT_TRUE(c.ok()) << c.status();
    client_ = std::move(c).value();
  }

  std::shared_ptr<Lease> Acquire() {
    AcquireOptions o;
    o.model = "mixed";
    o.wait_ready = true;
    auto l = client_->Acquire(o);
    EXPECT_TRUE(l.ok()) << l.status();
    return l.ok() ? std::shared_ptr<Lease>(std::move(l).value()) : nullptr;
  }

  int Leases() {
    auto st = client_->Status();
    EXPECT_TRUE(st.ok()) << st.status();
    int n = 0;
    for (const auto& e : st->entries()) n += static_cast<int>(e.lease_count());
    return n;
  }

  testing::TempDir tmp_;
  std::vector<safetensors::TensorData> tensors_;
  double f32_sum_ = 0;
  std::unique_ptr<memory::Backend> backend_;
  std::unique_ptr<server::Daemon> daemon_;
  std::unique_ptr<Client> client_;
};

TEST_F(TorchAdapterTest, ZeroCopyCpuTensorsWithTheFilesBytesDtypesShapesAndStrides) {
  auto lease = Acquire();
  ASSERT_NE(lease, nullptr);
  auto weights = ToTorch(lease);
  ASSERT_TRUE(weights.ok()) << weights.status();
  ASSERT_EQ(weights->size(), tensors_.size());
  const std::map<DType, c10::ScalarType> want = {{DType::kF32, c10::ScalarType::Float},
                                                 {DType::kI64, c10::ScalarType::Long},
                                                 {DType::kU8, c10::ScalarType::Byte},
                                                 {DType::kBF16, c10::ScalarType::BFloat16},
                                                 {DType::kBool, c10::ScalarType::Bool}};
  for (const auto& td : tensors_) {
    SCOPED_TRACE(td.name);
    auto it = weights->find(td.name);
    ASSERT_NE(it, weights->end());
    const at::Tensor& t = it->second;
    EXPECT_TRUE(t.device().is_cpu());
    EXPECT_EQ(t.scalar_type(), want.at(td.dtype));
    EXPECT_EQ(t.sizes().vec(), td.shape);
    EXPECT_TRUE(t.is_contiguous());
    EXPECT_FALSE(t.requires_grad());
    // Zero-copy: the tensor's storage is the mapping itself.
    EXPECT_EQ(t.data_ptr(), lease->Find(td.name)->data);
    ASSERT_EQ(static_cast<size_t>(t.nbytes()), td.bytes.size());
    EXPECT_EQ(std::memcmp(t.data_ptr(), td.bytes.data(), td.bytes.size()), 0);
  }
  const at::Tensor& a = weights->at("model.a.weight");
  EXPECT_EQ(a.strides().vec(), (std::vector<int64_t>{5, 1}));
  EXPECT_DOUBLE_EQ(a.sum().item<double>(), f32_sum_);
  EXPECT_EQ(weights->at("model.b.index")[1].item<int64_t>(), 1ll << 40);
  EXPECT_FLOAT_EQ(weights->at("model.d.weight").to(c10::ScalarType::Float).sum().item<float>(),
                  2.0f);
  EXPECT_EQ(weights->at("model.e.mask").sum().item<int64_t>(), 2);

  auto ordered = ToTorchOrdered(lease);
  ASSERT_TRUE(ordered.ok()) << ordered.status();
  ASSERT_EQ(ordered->size(), tensors_.size());
  for (size_t i = 0; i < tensors_.size(); ++i) EXPECT_EQ((*ordered)[i].first, tensors_[i].name);
}

TEST_F(TorchAdapterTest, TensorsKeepTheLeaseAndMappingAliveUntilTheLastOneDies) {
  auto lease = Acquire();
  ASSERT_NE(lease, nullptr);
  auto weights = ToTorch(lease);
  ASSERT_TRUE(weights.ok()) << weights.status();
  at::Tensor a = weights->at("model.a.weight");
  weights->clear();
  lease.reset();  // the engine drops its handle; only `a` holds the lease now
  EXPECT_EQ(Leases(), 1);
  EXPECT_DOUBLE_EQ(a.sum().item<double>(), f32_sum_);  // still mapped
  at::Tensor row = a[1];                               // a view shares the storage, hence the lease
  a = at::Tensor();
  EXPECT_EQ(Leases(), 1);
  EXPECT_FLOAT_EQ(row.sum().item<float>(), 0.25f * (5 + 6 + 7 + 8 + 9) - 5.0f);
  row = at::Tensor();
  // The last tensor died: the client unmapped and closed its handle connection.
  auto deadline = std::chrono::steady_clock::now() + 10s;
  while (Leases() != 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(5ms);  // polling the daemon's view with a deadline
  }
  EXPECT_EQ(Leases(), 0);
}

TEST(TorchDType, MapsEverySafetensorsDtypeThisTorchHas) {
  EXPECT_EQ(*TorchDType(DType::kF16), c10::ScalarType::Half);
  EXPECT_EQ(*TorchDType(DType::kI8), c10::ScalarType::Char);
  EXPECT_EQ(*TorchDType(DType::kI32), c10::ScalarType::Int);
  EXPECT_EQ(*TorchDType(DType::kF64), c10::ScalarType::Double);
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 1)
  EXPECT_EQ(*TorchDType(DType::kF8_E4M3), c10::ScalarType::Float8_e4m3fn);
  EXPECT_EQ(*TorchDType(DType::kF8_E5M2), c10::ScalarType::Float8_e5m2);
#else
  auto f8 = TorchDType(DType::kF8_E4M3);
  EXPECT_EQ(f8.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(f8.status().message().find("F8_E4M3"), absl::string_view::npos) << f8.status();
  EXPECT_NE(f8.status().message().find(TORCH_VERSION), absl::string_view::npos) << f8.status();
#endif
}

}  // namespace
}  // namespace weightcache::client
