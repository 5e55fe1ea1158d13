#include "pkg/load/fp8_quant.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace weightcache::load {
namespace {

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

constexpr uint32_t kAbsMask = 0x7FFFFFFFu;
constexpr uint32_t kInfBits = 0x7F800000u;
constexpr uint32_t k448Bits = 0x43E00000u;  // 448.0f

// Shifts `mant` right by `shift` (>= 1), rounding to nearest, ties to even.
uint32_t ShiftRne(uint32_t mant, uint32_t shift) {
  if (shift >= 32) return 0;
  const uint32_t q = mant >> shift;
  const uint32_t rem = mant & ((1u << shift) - 1);
  const uint32_t half = 1u << (shift - 1);
  return q + ((rem > half || (rem == half && (q & 1u))) ? 1u : 0u);
}

float LoadElement(safetensors::DType dtype, const void* src, uint64_t i) {
  uint16_t h;
  std::memcpy(&h, static_cast<const uint8_t*>(src) + 2 * i, 2);
  return dtype == safetensors::DType::kBF16 ? Bf16ToFloat(h) : HalfToFloat(h);
}

}  // namespace

float Bf16ToFloat(uint16_t bits) { return FromBits(static_cast<uint32_t>(bits) << 16); }

float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu;
  uint32_t mant = h & 0x3FFu;
  if (exp == 0x1F) return FromBits(sign | kInfBits | (mant << 13));  // inf / nan
  if (exp != 0) return FromBits(sign | ((exp + 112) << 23) | (mant << 13));
  if (mant == 0) return FromBits(sign);
  // Subnormal half: mant * 2^-24, normal as a float.
  int e = -1;
  do {
    mant <<= 1;
    ++e;
  } while ((mant & 0x400u) == 0);
  return FromBits(sign | (static_cast<uint32_t>(112 - e) << 23) | ((mant & 0x3FFu) << 13));
}

float E4M3ToFloat(uint8_t code) {
  const float sign = (code & 0x80u) != 0 ? -1.0f : 1.0f;
  const int exp = (code >> 3) & 0xF;
  const int mant = code & 0x7;
  if (exp == 0xF && mant == 0x7) return std::nanf("");
  if (exp == 0) return sign * std::ldexp(static_cast<float>(mant), -9);
  return sign * std::ldexp(static_cast<float>(8 + mant), exp - 10);
}

uint8_t FloatToE4M3(float x) {
  const uint32_t bits = Bits(x);
  const uint8_t sign = static_cast<uint8_t>((bits >> 24) & 0x80u);
  const uint32_t abs = bits & kAbsMask;
  if (abs > kInfBits) return static_cast<uint8_t>(sign | 0x7Fu);   // NaN
  if (abs >= k448Bits) return static_cast<uint8_t>(sign | 0x7Eu);  // saturate (and +-Inf)
  const uint32_t e = abs >> 23;  // biased float exponent; 0 for float subnormals
  const uint32_t mant = (abs & 0x7FFFFFu) | (e != 0 ? 0x800000u : 0u);  // value = mant*2^(E-150)
  const uint32_t big_e = std::max<uint32_t>(e, 1);
  if (big_e >= 121) {
    // Normal e4m3 (>= 2^-6): exponent big_e - 120 (bias 7), 3 mantissa bits.
    uint32_t m = ShiftRne(mant, 20);  // 8..16 (implicit bit included)
    uint32_t fe = big_e - 120;
    if (m == 16) {  // rounded up into the next binade
      m = 8;
      ++fe;
    }
    return static_cast<uint8_t>(sign | (fe << 3) | (m & 7u));  // < 448, so never 0x7F
  }
  // Subnormal e4m3: a multiple of 2^-9; a result of 8 is the smallest normal, code 0x08.
  const uint32_t q = ShiftRne(mant, 141 - big_e);
  return static_cast<uint8_t>(sign | q);
}

float Fp8BlockScale(float amax) { return amax == 0.0f ? 1.0f : amax / kFp8E4M3Max; }

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
          const float a =
              std::fabs(LoadElement(src_dtype, src, static_cast<uint64_t>(r * cols + c)));
          if (std::isfinite(a) && a > amax) amax = a;
        }
      }
      const float scale = Fp8BlockScale(amax);
      out_scale_inv[bi * bcols + bj] = scale;
      for (int64_t r = r0; r < r1; ++r) {
        for (int64_t c = c0; c < c1; ++c) {
          const uint64_t i = static_cast<uint64_t>(r * cols + c);
          out_fp8[i] = QuantizeElement(LoadElement(src_dtype, src, i), scale);
        }
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace weightcache::load
