// Online block-FP8 quantization on the GPU: throughput table, and the PyTorch parity check.
//
//   fp8_quant_bench [--iters=N]          table (markdown) of kernel throughput per shape
//   fp8_quant_bench --compare=DIR        DIR from tests/gpu/fp8_torch_parity.py: for each case,
//                                        our kernel and our CPU quantizer against torch's
//                                        to(float8_e4m3fn) (exit 1 on any difference)
//
// Throughput: "moved" counts the bytes the kernel must move (2 read + 1 written per element,
// plus 4 per 128x128 scale) over the median kernel time (CUDA events, after a warm-up);
// "bf16 in" counts the source bytes only. The L2 cache is flushed before each timed launch.
// Each shape is timed with every kernel variant (fp8_quant.cu), the production one last.
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "pkg/load/fp8_quant.h"
#include "pkg/load/internal/fp8_quant_cuda.h"
#include "pkg/load/internal/fp8_quant_cuda_testing.h"

namespace {

using weightcache::safetensors::DType;
namespace wl = weightcache::load;

bool ReadAll(const std::string& path, std::vector<uint8_t>* out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  out->assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  return true;
}

int Compare(const std::string& dir) {
  std::ifstream meta(dir + "/cases.txt");
  if (!meta) {
    std::fprintf(stderr, "no %s/cases.txt\n", dir.c_str());
    return 2;
  }
  int failures = 0, cases = 0;
  std::string name;
  int64_t rows = 0, cols = 0;
  std::printf("| case | shape | elements | gpu == torch | cpu == gpu | scales equal |\n");
  std::printf("|---|---|---:|---|---|---|\n");
  while (meta >> name >> rows >> cols) {
    ++cases;
    std::vector<uint8_t> in, want_fp8, want_scale;
    if (!ReadAll(dir + "/" + name + ".in", &in) || !ReadAll(dir + "/" + name + ".fp8", &want_fp8) ||
        !ReadAll(dir + "/" + name + ".scale", &want_scale)) {
      std::fprintf(stderr, "%s: missing files\n", name.c_str());
      return 2;
    }
    const size_t n = static_cast<size_t>(rows * cols);
    const size_t ns = static_cast<size_t>(((rows + 127) / 128) * ((cols + 127) / 128));
    if (in.size() != 2 * n || want_fp8.size() != n || want_scale.size() != 4 * ns) {
      std::fprintf(stderr, "%s: file sizes do not match [%lld, %lld]\n", name.c_str(),
                   static_cast<long long>(rows), static_cast<long long>(cols));
      return 2;
    }
    std::vector<uint8_t> gpu(n), cpu(n);
    std::vector<float> gpu_s(ns), cpu_s(ns);
    auto st = wl::internal::QuantizeFp8BlockOnGpu(0, DType::kBF16, in.data(), rows, cols, 128, 128,
                                                  gpu.data(), gpu_s.data());
    if (!st.ok()) {
      std::fprintf(stderr, "%s: %s\n", name.c_str(), std::string(st.message()).c_str());
      return 2;
    }
    (void)wl::QuantizeFp8Block(DType::kBF16, in.data(), rows, cols, 128, 128, cpu.data(),
                               cpu_s.data());
    size_t diff_torch = 0, diff_cpu = 0, first = n;
    for (size_t i = 0; i < n; ++i) {
      if (gpu[i] != want_fp8[i]) {
        if (first == n) first = i;
        ++diff_torch;
      }
      diff_cpu += gpu[i] != cpu[i];
    }
    const bool scales = std::memcmp(gpu_s.data(), want_scale.data(), 4 * ns) == 0 &&
                        std::memcmp(gpu_s.data(), cpu_s.data(), 4 * ns) == 0;
    std::printf("| %s | [%lld, %lld] | %zu | %s | %s | %s |\n", name.c_str(),
                static_cast<long long>(rows), static_cast<long long>(cols), n,
                diff_torch == 0 ? "yes" : absl::StrCat("NO: ", diff_torch, " differ").c_str(),
                diff_cpu == 0 ? "yes" : absl::StrCat("NO: ", diff_cpu, " differ").c_str(),
                scales ? "yes" : "NO");
    if (first != n) {
      uint16_t x;
      std::memcpy(&x, in.data() + 2 * first, 2);
      std::fprintf(stderr, "%s: first difference at %zu: input 0x%04x, ours 0x%02x, torch 0x%02x\n",
                   name.c_str(), first, x, gpu[first], want_fp8[first]);
    }
    failures += (diff_torch != 0 || diff_cpu != 0 || !scales);
  }
  std::printf("\n%d cases, %d failed\n", cases, failures);
  return failures == 0 && cases > 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  int iters = 20;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--compare=", 0) == 0) return Compare(a.substr(10));
    if (a.rfind("--iters=", 0) == 0) iters = std::stoi(a.substr(8));
  }
  if (wl::internal::GpuCount() == 0) {
    std::fprintf(stderr, "no GPU\n");
    return 2;
  }
  struct Shape {
    const char* what;
    int64_t rows, cols;
  };
  const Shape shapes[] = {
      {"4096 x 4096 (8B q_proj)", 4096, 4096},
      {"14336 x 4096 (8B gate/up)", 14336, 4096},
      {"7168 x 18432 (DeepSeek-V3 dense down, transposed)", 7168, 18432},
      {"28672 x 8192 (70B gate/up)", 28672, 8192},
      {"16384 x 16384 (512 MiB bf16)", 16384, 16384},
      {"2048 x 7168 (DeepSeek-V3 expert)", 2048, 7168},
  };
  using V = wl::internal::Fp8Variant;
  const std::pair<V, const char*> variants[] = {
      {V::kReference, "reference (fdiv + integer)"},
      {V::kFastInt, "fast div + integer"},
      {V::kFastCvt, "fast div + hw cvt (production)"},
  };
  std::printf(
      "| shape | dtype | kernel variant | kernel time | bf16 in | moved (in + out + scales) |\n");
  std::printf("|---|---|---|---:|---:|---:|\n");
  int rc = 0;
  for (DType dt : {DType::kBF16, DType::kF16}) {
    for (const auto& s : shapes) {
      for (const auto& [variant, vname] : variants) {
        auto t = wl::internal::TimeFp8BlockQuantOnGpu(0, dt, s.rows, s.cols, iters, variant);
        if (!t.ok()) {
          std::fprintf(stderr, "%s: %s\n", s.what, std::string(t.status().message()).c_str());
          rc = 1;
          continue;
        }
        const double n = static_cast<double>(s.rows) * static_cast<double>(s.cols);
        const int64_t blocks = ((s.rows + 127) / 128) * ((s.cols + 127) / 128);  // ceil, on purpose
        const double moved = n * 3 + 4.0 * static_cast<double>(blocks);
        std::printf("| %s | %s | %s | %.1f us | %.2f TB/s | %.2f TB/s |\n", s.what,
                    dt == DType::kBF16 ? "bf16" : "fp16", vname, *t * 1e6, n * 2 / *t / 1e12,
                    moved / *t / 1e12);
      }
    }
  }
  return rc;
}
