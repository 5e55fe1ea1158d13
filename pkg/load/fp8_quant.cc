#include "pkg/load/fp8_quant.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "pkg/load/internal/fp8_math.h"

namespace weightcache::load {
namespace {

float LoadElement(safetensors::DType dtype, const void* src, uint64_t i) {
  uint16_t h;
  std::memcpy(&h, static_cast<const uint8_t*>(src) + 2 * i, 2);
  return dtype == safetensors::DType::kBF16 ? internal::Fp8Bf16ToFloat(h)
                                            : internal::Fp8HalfToFloat(h);
}

}  // namespace

// The maths lives in internal/fp8_math.h, shared with the CUDA kernel (fp8_quant.cu).
float Bf16ToFloat(uint16_t bits) { return internal::Fp8Bf16ToFloat(bits); }

float HalfToFloat(uint16_t h) { return internal::Fp8HalfToFloat(h); }

float E4M3ToFloat(uint8_t code) {
  const float sign = (code & 0x80u) != 0 ? -1.0f : 1.0f;
  const int exp = (code >> 3) & 0xF;
  const int mant = code & 0x7;
  if (exp == 0xF && mant == 0x7) return std::nanf("");
  if (exp == 0) return sign * std::ldexp(static_cast<float>(mant), -9);
  return sign * std::ldexp(static_cast<float>(8 + mant), exp - 10);
}

uint8_t FloatToE4M3(float x) { return internal::Fp8FloatToE4M3(x); }

float Fp8BlockScale(float amax) { return internal::Fp8ScaleFromAmax(amax); }

absl::Status QuantizeFp8Block(safetensors::DType src_dtype, const void* src, int64_t rows,
                              int64_t cols, int block_rows, int block_cols, uint8_t* out_fp8,
                              float* out_scale_inv) {
  if (src_dtype != safetensors::DType::kBF16 && src_dtype != safetensors::DType::kF16) {
    return absl::InvalidArgumentError(absl::StrCat("fp8 block quantization: source dtype ",
                                                   std::string(safetensors::DTypeName(src_dtype)),
                                                   " is not BF16 or F16"));
  }
  if (block_rows <= 0 || block_cols <= 0 || rows < 0 || cols < 0) {
    return absl::InvalidArgumentError(absl::StrCat("fp8 block quantization: bad shape [", rows,
                                                   ", ", cols, "] or block ", block_rows, "x",
                                                   block_cols));
  }
  const int64_t brows = (rows + block_rows - 1) / block_rows;
  const int64_t bcols = (cols + block_cols - 1) / block_cols;
  for (int64_t bi = 0; bi < brows; ++bi) {
    const int64_t r0 = bi * block_rows;
    const int64_t r1 = std::min<int64_t>(rows, r0 + block_rows);
    for (int64_t bj = 0; bj < bcols; ++bj) {
      const int64_t c0 = bj * block_cols;
      const int64_t c1 = std::min<int64_t>(cols, c0 + block_cols);
      float amax = 0.0f;
      for (int64_t r = r0; r < r1; ++r) {
        for (int64_t c = c0; c < c1; ++c) {
          amax =
              internal::Fp8MaxAbs(amax, internal::Fp8FiniteAbs(LoadElement(
                                            src_dtype, src, static_cast<uint64_t>(r * cols + c))));
        }
      }
      const float scale = Fp8BlockScale(amax);
      out_scale_inv[bi * bcols + bj] = scale;
      for (int64_t r = r0; r < r1; ++r) {
        for (int64_t c = c0; c < c1; ++c) {
          const uint64_t i = static_cast<uint64_t>(r * cols + c);
          out_fp8[i] = internal::Fp8QuantizeElement(LoadElement(src_dtype, src, i), scale);
        }
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace weightcache::load
