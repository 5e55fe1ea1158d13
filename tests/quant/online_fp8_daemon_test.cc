// A real weightcached (host backend) serving a bf16 Llama checkpoint with `quantization:
// fp8_block` (online quantization) at tp 1 and tp 2, read through the client library:
// quantized weights are F8_E4M3 with F32 weight_scale_inv tensors of the block grid, their
// bytes equal the CPU quantizer applied to the original shard (sliced here from the file,
// independently of the planner), every other tensor is the original bytes, and the
// fingerprint differs from the unquantized serving of the same files.
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "pkg/client/client.h"
#include "pkg/load/fp8_quant.h"
#include "pkg/safetensors/writer.h"
#include "tests/integration/daemon_harness.h"
#include "tests/integration/process.h"
#include "tests/testutil/temp_dir.h"
#include "weightcache/v1/weightcache.pb.h"

namespace weightcache {
namespace {

using namespace std::chrono_literals;
using safetensors::DType;
using testing::Process;
using testing::TempDir;

safetensors::LlamaShape Shape() {
  safetensors::LlamaShape s;
  s.layers = 2;
  s.hidden = 384;        // 192 per rank at tp 2: ragged 128-blocks on row splits
  s.intermediate = 640;  // 320 per rank: ragged on both splits
  s.heads = 6;
  s.kv_heads = 2;
  s.vocab = 1000;
  return s;
}

class OnlineFp8DaemonTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(safetensors::WriteLlamaCheckpoint(dir_ / "llama", Shape()).ok());
    socket_dir_ = dir_ / "s";
    std::ofstream(dir_ / "models.yaml") << "models:\n"
                                        << "  - {name: plain, model_dir: " << dir_ / "llama"
                                        << "}\n"
                                        << "  - {name: q1, model_dir: " << dir_ / "llama"
                                        << ", quantization: fp8_block}\n"
                                        << "  - {name: q2, model_dir: " << dir_ / "llama"
                                        << ", quantization: fp8_block, tp_size: 2}\n";
    auto d =
        testing::StartDaemon({WEIGHTCACHED_PATH, "--socket_dir=" + socket_dir_, "--backend=host",
                              "--metrics_address=off", "--spec_file=" + dir_ / "models.yaml"},
                             socket_dir_, dir_ / "daemon.log");
    ASSERT_TRUE(d.ok()) << d.status();
    daemon_ = std::move(d->process);
    client_ = std::move(d->client);
  }

  std::string Log() const { return testing::ReadFileOrEmpty(dir_ / "daemon.log"); }

  std::unique_ptr<client::Lease> Acquire(const std::string& model, int tp, int rank) {
    client::AcquireOptions o;
    o.model = model;
    o.tp_size = tp;
    o.tp_rank = rank;
    o.wait_ready = true;
    auto lease = client_->Acquire(o);
    EXPECT_TRUE(lease.ok()) << lease.status() << "\n" << Log();
    return lease.ok() ? std::move(lease).value() : nullptr;
  }

  TempDir dir_;
  std::string socket_dir_;
  std::unique_ptr<Process> daemon_;
  std::unique_ptr<client::Client> client_;
};

// Rows [r0, r1) x columns [c0, c1) of a 2-D tensor of the checkpoint, row-major.
std::string Slice(const safetensors::Checkpoint& ckpt, const safetensors::TensorInfo& t, int64_t r0,
                  int64_t r1, int64_t c0, int64_t c1) {
  const size_t el = safetensors::DTypeSize(t.dtype);
  const int64_t cols = t.shape.size() == 2 ? t.shape[1] : 1;
  std::string out, row((c1 - c0) * el, '\0');
  for (int64_t r = r0; r < r1; ++r) {
    EXPECT_EQ(::pread(ckpt.files()[t.file_index].fd(), row.data(), row.size(),
                      static_cast<off_t>(t.file_offset + (r * cols + c0) * el)),
              static_cast<ssize_t>(row.size()));
    out += row;
  }
  return out;
}

std::string Bytes(const client::TensorView& v) {
  return std::string(static_cast<const char*>(v.data), v.nbytes);
}

bool Quantized(const std::string& name) {
  for (const char* p :
       {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}) {
    if (name.find(std::string(".") + p + ".weight") != std::string::npos && name.size() >= 7 &&
        name.compare(name.size() - 7, 7, ".weight") == 0) {
      return true;
    }
  }
  return false;
}

TEST_F(OnlineFp8DaemonTest, ServesQuantizedShardsAtTp1AndTp2) {
  auto ckpt = safetensors::Checkpoint::Open(dir_ / "llama");
  ASSERT_TRUE(ckpt.ok());
  auto plain = Acquire("plain", 1, 0);
  ASSERT_NE(plain, nullptr);
  for (auto [model, tp] : {std::pair<const char*, int>{"q1", 1}, {"q2", 2}}) {
    for (int rank = 0; rank < tp; ++rank) {
      SCOPED_TRACE(absl::StrCat(model, " rank ", rank));
      auto lease = Acquire(model, tp, rank);
      ASSERT_NE(lease, nullptr);
      EXPECT_NE(lease->fingerprint(), plain->fingerprint());
      int quantized = 0, scales = 0, kept = 0;
      for (const auto& t : ckpt->tensors()) {
        const auto* v = lease->Find(t.name);
        ASSERT_NE(v, nullptr) << t.name;
        const auto* sc = lease->Find(t.name + "_scale_inv");
        if (!Quantized(t.name)) {
          EXPECT_EQ(sc, nullptr) << t.name << " must not be quantized";
          EXPECT_EQ(v->dtype, t.dtype) << t.name;
          if (tp == 1) {  // unchanged bytes (the tp 2 shards are the planner's own tests)
            EXPECT_EQ(Bytes(*v),
                      Slice(*ckpt, t, 0, t.shape[0], 0, t.shape.size() == 2 ? t.shape[1] : 1))
                << t.name;
          }
          ++kept;
          continue;
        }
        ++quantized;
        // This rank's original bf16 shard, sliced here: column-parallel splits rows,
        // row-parallel (o_proj, down_proj) splits columns.
        const bool row_parallel = t.name.find("o_proj") != std::string::npos ||
                                  t.name.find("down_proj") != std::string::npos;
        int64_t r0 = 0, r1 = t.shape[0], c0 = 0, c1 = t.shape[1];
        if (row_parallel) {
          c0 = t.shape[1] / tp * rank;
          c1 = c0 + t.shape[1] / tp;
        } else {
          r0 = t.shape[0] / tp * rank;
          r1 = r0 + t.shape[0] / tp;
        }
        const int64_t rows = r1 - r0, cols = c1 - c0;
        EXPECT_EQ(v->dtype, DType::kF8_E4M3) << t.name;
        EXPECT_EQ(v->shape, (std::vector<int64_t>{rows, cols})) << t.name;
        const std::string src = Slice(*ckpt, t, r0, r1, c0, c1);
        std::string fp8(static_cast<size_t>(rows * cols), '\0');
        std::vector<float> s(static_cast<size_t>(((rows + 127) / 128) * ((cols + 127) / 128)));
        ASSERT_TRUE(load::QuantizeFp8Block(DType::kBF16, src.data(), rows, cols, 128, 128,
                                           reinterpret_cast<uint8_t*>(fp8.data()), s.data())
                        .ok());
        EXPECT_EQ(Bytes(*v), fp8) << t.name;
        ASSERT_NE(sc, nullptr) << t.name;
        ++scales;
        EXPECT_EQ(sc->dtype, DType::kF32);
        EXPECT_EQ(sc->shape, (std::vector<int64_t>{(rows + 127) / 128, (cols + 127) / 128}));
        EXPECT_EQ(Bytes(*sc), std::string(reinterpret_cast<const char*>(s.data()), s.size() * 4))
            << sc->name;
      }
      EXPECT_EQ(quantized, 2 * 7);
      EXPECT_EQ(scales, 2 * 7);
      EXPECT_EQ(kept, 2 * 2 + 3);  // 2 norms per layer, embed_tokens, norm, lm_head
      EXPECT_EQ(lease->tensors().size(), ckpt->tensors().size() + 2 * 7);
    }
  }
  // The cache keys them apart: three distinct fingerprints for q1 and the q2 ranks.
  auto q1 = Acquire("q1", 1, 0);
  auto q2 = Acquire("q2", 2, 0);
  ASSERT_TRUE(q1 && q2);
  EXPECT_NE(q1->fingerprint(), q2->fingerprint());
}

}  // namespace
}  // namespace weightcache
