// The CPU block-FP8 quantizer against hand-checked values and a straightforward reference
// (nearest of all 255 e4m3fn values by exhaustive search, ties to the even code).
#include "pkg/load/fp8_quant.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace weightcache::load {
namespace {

using safetensors::DType;

float F(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
uint32_t B(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// e4m3fn by the definition: bias 7, subnormals m * 2^-9, S.1111.111 is NaN, no infinity.
double RefDecode(uint8_t c) {
  const int e = (c >> 3) & 0xF, m = c & 7;
  const double v = e == 0 ? m * std::pow(2.0, -9) : (1.0 + m / 8.0) * std::pow(2.0, e - 7);
  return (c & 0x80) ? -v : v;
}

uint8_t RefEncode(float x) {
  const uint8_t sign = std::signbit(x) ? 0x80 : 0;
  if (std::isnan(x)) return sign | 0x7F;
  const double a = std::fabs(static_cast<double>(x));
  if (a >= 448.0) return sign | 0x7E;
  int best = 0;
  double best_err = std::numeric_limits<double>::infinity();
  for (int c = 0; c <= 0x7E; ++c) {
    const double err = std::fabs(RefDecode(static_cast<uint8_t>(c)) - a);
    if (err < best_err || (err == best_err && (c & 1) == 0)) {
      best = c;
      best_err = err;
    }
  }
  return static_cast<uint8_t>(sign | best);
}

TEST(Fp8, HandCheckedValues) {
  struct Want {
    float x;
    uint8_t code;
  };
  const Want wants[] = {
      {448.0f, 0x7E},  // the largest finite
      {-448.0f, 0xFE},
      {0.5f, 0x30},  // 2^-1: exponent 6
      {1.0f, 0x38},
      {240.0f, 0x77},  // 1.875 * 2^7
      {0.0f, 0x00},
      {-0.0f, 0x80},
      {std::ldexp(1.0f, -6), 0x08},    // smallest normal
      {std::ldexp(1.0f, -9), 0x01},    // smallest subnormal
      {std::ldexp(7.0f, -9), 0x07},    // largest subnormal
      {std::ldexp(1.0f, -10), 0x00},   // half the smallest subnormal: tie to even 0
      {std::ldexp(3.0f, -11), 0x01},   // 0.75 * 2^-9 rounds up
      {std::ldexp(3.0f, -10), 0x02},   // 1.5 * 2^-9: tie to even 2
      {std::ldexp(5.0f, -10), 0x02},   // 2.5 * 2^-9: tie to even 2
      {std::ldexp(15.0f, -10), 0x08},  // 7.5 * 2^-9: tie, rounds up into the normal binade
      {1.9375f, 0x40},                 // between 1.875 and 2: tie to even, next binade (2.0)
      {1.0625f, 0x38},                 // between 1 and 1.125: tie to even (1.0)
      {1.1875f, 0x3A},                 // between 1.125 and 1.25: tie to even (1.25)
      {460.0f, 0x7E},                  // above 448: saturates (torch's cast would give NaN >= 464)
      {1e6f, 0x7E},
      {-1e30f, 0xFE},
      {std::numeric_limits<float>::infinity(), 0x7E},
      {-std::numeric_limits<float>::infinity(), 0xFE},
      {std::numeric_limits<float>::quiet_NaN(), 0x7F},
      {-std::numeric_limits<float>::quiet_NaN(), 0xFF},
      {std::numeric_limits<float>::denorm_min(), 0x00},
      {447.99f, 0x7E},
      {432.0f, 0x7E},  // between 416 and 448: tie to even (448, mantissa 6)
      {431.9f, 0x7D},
  };
  for (const auto& w : wants) {
    EXPECT_EQ(FloatToE4M3(w.x), w.code) << w.x;
    EXPECT_EQ(RefEncode(w.x), w.code) << "reference disagrees with the hand value " << w.x;
  }
  EXPECT_EQ(E4M3ToFloat(0x7E), 448.0f);
  EXPECT_EQ(E4M3ToFloat(0x01), std::ldexp(1.0f, -9));
  EXPECT_TRUE(std::isnan(E4M3ToFloat(0x7F)));
  EXPECT_TRUE(std::isnan(E4M3ToFloat(0xFF)));
}

TEST(Fp8, DecodeAndRoundTripEveryCode) {
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7F) == 0x7F) continue;
    const float v = E4M3ToFloat(static_cast<uint8_t>(c));
    EXPECT_EQ(static_cast<double>(v), RefDecode(static_cast<uint8_t>(c))) << c;
    EXPECT_EQ(FloatToE4M3(v), c) << c;
  }
}

TEST(Fp8, EncodeMatchesReferenceOnEveryBf16AndHalfAndRandomFloats) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float bf = Bf16ToFloat(static_cast<uint16_t>(h));
    ASSERT_EQ(B(bf), h << 16);
    ASSERT_EQ(FloatToE4M3(bf), RefEncode(bf)) << std::hex << h;
    const float hf = HalfToFloat(static_cast<uint16_t>(h));
    // The widening is exact: compare with the definition of IEEE half.
    const int e = (h >> 10) & 0x1F, m = h & 0x3FF;
    if (e == 0x1F) {
      ASSERT_TRUE(m != 0 ? std::isnan(hf) : std::isinf(hf)) << h;
    } else {
      const double v = e == 0 ? std::ldexp(m, -24) : std::ldexp(1024 + m, e - 25);
      ASSERT_EQ(static_cast<double>(hf), (h & 0x8000) ? -v : v) << h;
    }
    ASSERT_EQ(FloatToE4M3(hf), RefEncode(hf)) << std::hex << h;
  }
  std::mt19937_64 rng(7);
  for (int i = 0; i < 300000; ++i) {
    uint32_t bits = static_cast<uint32_t>(rng());
    // Half of them near the e4m3 range, where rounding is interesting.
    if (i % 2 == 0)
      bits = (bits & 0x807FFFFFu) | ((100u + static_cast<uint32_t>(rng() % 40)) << 23);
    const float x = F(bits);
    ASSERT_EQ(FloatToE4M3(x), RefEncode(x)) << std::hex << bits;
  }
}

// The block quantizer by the book: per block, amax of the finite |x|, scale = amax / 448
// (1 for an all-zero block), code = nearest(x / scale).
void RefQuantize(DType dt, const std::vector<uint16_t>& src, int64_t rows, int64_t cols, int br,
                 int bc, std::vector<uint8_t>* q, std::vector<float>* s) {
  auto at = [&](int64_t r, int64_t c) {
    const uint16_t h = src[static_cast<size_t>(r * cols + c)];
    return dt == DType::kBF16 ? Bf16ToFloat(h) : HalfToFloat(h);
  };
  const int64_t nbr = (rows + br - 1) / br, nbc = (cols + bc - 1) / bc;
  q->assign(static_cast<size_t>(rows * cols), 0);
  s->assign(static_cast<size_t>(nbr * nbc), 0);
  for (int64_t i = 0; i < nbr; ++i) {
    for (int64_t j = 0; j < nbc; ++j) {
      float amax = 0;
      for (int64_t r = i * br; r < std::min<int64_t>(rows, (i + 1) * br); ++r) {
        for (int64_t c = j * bc; c < std::min<int64_t>(cols, (j + 1) * bc); ++c) {
          if (std::isfinite(at(r, c))) amax = std::max(amax, std::fabs(at(r, c)));
        }
      }
      const float scale = amax == 0 ? 1.0f : amax / 448.0f;
      (*s)[static_cast<size_t>(i * nbc + j)] = scale;
      for (int64_t r = i * br; r < std::min<int64_t>(rows, (i + 1) * br); ++r) {
        for (int64_t c = j * bc; c < std::min<int64_t>(cols, (j + 1) * bc); ++c) {
          (*q)[static_cast<size_t>(r * cols + c)] = RefEncode(at(r, c) / scale);
        }
      }
    }
  }
}

std::vector<uint16_t> RandomBits(DType dt, size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, 0.02f);
  std::vector<uint16_t> out(n);
  for (auto& v : out) {
    const float x = dist(rng) * (rng() % 16 == 0 ? 50.0f : 1.0f);  // some outliers
    if (dt == DType::kBF16) {
      v = static_cast<uint16_t>(B(x) >> 16);
    } else {
      // Nearest half (values are well inside its range; truncation is fine for a test input).
      const uint32_t b = B(x);
      const int e = static_cast<int>((b >> 23) & 0xFF) - 127 + 15;
      v = static_cast<uint16_t>(((b >> 16) & 0x8000) |
                                (e <= 0 ? 0 : (e << 10) | ((b >> 13) & 0x3FF)));
    }
  }
  return out;
}

TEST(Fp8, BlockQuantizerMatchesReferenceWithRaggedEdges) {
  for (DType dt : {DType::kBF16, DType::kF16}) {
    const int64_t rows = 300, cols = 200;  // 128x128 blocks: 3x2 grid, ragged bottom and right
    std::vector<uint16_t> src = RandomBits(dt, rows * cols, dt == DType::kBF16 ? 1 : 2);
    // Block (1, 1) all zero; block (2, 0) holds special values.
    for (int64_t r = 128; r < 256; ++r) {
      for (int64_t c = 128; c < 200; ++c) src[r * cols + c] = 0;
    }
    const uint16_t inf = dt == DType::kBF16 ? 0x7F80 : 0x7C00;
    const uint16_t nan = dt == DType::kBF16 ? 0x7FC0 : 0x7E00;
    src[260 * cols + 3] = inf;
    src[261 * cols + 4] = nan;
    src[262 * cols + 5] = static_cast<uint16_t>(0x8000 | inf);
    std::vector<uint8_t> q(rows * cols);
    std::vector<float> s(3 * 2);
    ASSERT_TRUE(QuantizeFp8Block(dt, src.data(), rows, cols, 128, 128, q.data(), s.data()).ok());
    std::vector<uint8_t> rq;
    std::vector<float> rs;
    RefQuantize(dt, src, rows, cols, 128, 128, &rq, &rs);
    ASSERT_EQ(s.size(), rs.size());
    for (size_t i = 0; i < s.size(); ++i) EXPECT_EQ(B(s[i]), B(rs[i])) << "scale " << i;
    ASSERT_TRUE(q == rq);

    // Ragged edge scale: block (2, 1) covers rows 256..299 and cols 128..199 only.
    float amax = 0;
    for (int64_t r = 256; r < 300; ++r) {
      for (int64_t c = 128; c < 200; ++c) {
        const uint16_t h = src[r * cols + c];
        amax = std::max(amax, std::fabs(dt == DType::kBF16 ? Bf16ToFloat(h) : HalfToFloat(h)));
      }
    }
    EXPECT_EQ(s[2 * 2 + 1], amax / 448.0f);
    EXPECT_EQ(s[1 * 2 + 1], 1.0f) << "an all-zero block has scale 1";
    for (int64_t r = 128; r < 256; ++r) EXPECT_EQ(q[r * cols + 150], 0);
    // Special values: +-Inf saturate, NaN stays NaN, and neither sets the block's scale.
    EXPECT_EQ(q[260 * cols + 3], 0x7E);
    EXPECT_EQ(q[261 * cols + 4], 0x7F);
    EXPECT_EQ(q[262 * cols + 5], 0xFE);
    EXPECT_TRUE(std::isfinite(s[2 * 2 + 0]));

    // The block's largest element maps to +-448; dequant error within half an e4m3 step.
    int64_t arg = 0;
    for (int64_t r = 0; r < 128; ++r) {
      for (int64_t c = 0; c < 128; ++c) {
        auto v = [&](int64_t i) {
          return std::fabs(dt == DType::kBF16 ? Bf16ToFloat(src[i]) : HalfToFloat(src[i]));
        };
        if (v(r * cols + c) > v(arg)) arg = r * cols + c;
      }
    }
    EXPECT_EQ(q[arg] & 0x7F, 0x7E);
    for (int64_t r = 0; r < 128; ++r) {
      for (int64_t c = 0; c < 128; ++c) {
        const uint16_t h = src[r * cols + c];
        const float x = dt == DType::kBF16 ? Bf16ToFloat(h) : HalfToFloat(h);
        const float deq = E4M3ToFloat(q[r * cols + c]) * s[0];
        const float tol = std::max(std::fabs(x) / 16.0f, std::ldexp(1.0f, -10) * s[0]) * 1.0001f;
        ASSERT_LE(std::fabs(deq - x), tol) << r << "," << c;
      }
    }
  }
}

TEST(Fp8, HandBlock) {
  // One 2x2 block of bf16 {448*s, 0.5*s, -1*s, tiny}: with amax 896, scale 2.
  const uint16_t v[4] = {
      static_cast<uint16_t>(B(896.0f) >> 16), static_cast<uint16_t>(B(1.0f) >> 16),
      static_cast<uint16_t>(B(-2.0f) >> 16), static_cast<uint16_t>(B(std::ldexp(1.0f, -8)) >> 16)};
  uint8_t q[4];
  float s;
  ASSERT_TRUE(QuantizeFp8Block(DType::kBF16, v, 2, 2, 128, 128, q, &s).ok());
  EXPECT_EQ(s, 2.0f);
  EXPECT_EQ(q[0], 0x7E);  // 448
  EXPECT_EQ(q[1], 0x30);  // 0.5
  EXPECT_EQ(q[2], 0xB8);  // -1
  EXPECT_EQ(q[3], 0x01);  // 2^-9: the smallest subnormal
}

TEST(Fp8, RejectsOtherDtypesAndBadBlocks) {
  float x = 1;
  uint8_t q;
  float s;
  auto st = QuantizeFp8Block(DType::kF32, &x, 1, 1, 128, 128, &q, &s);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(st.message()),
            "fp8 block quantization: source dtype F32 is not BF16 or F16");
  EXPECT_EQ(QuantizeFp8Block(DType::kBF16, &x, 1, 1, 0, 128, &q, &s).code(),
            absl::StatusCode::kInvalidArgument);
}

// The sign of a NaN input is kept (0xFF for -NaN) without relying on how the division
// propagates NaN: the GPU's __fdiv_rn returns a positive canonical NaN (seen on the H200),
// so QuantizeElement answers NaN before dividing, on both sides.
TEST(Fp8, NegativeNanKeepsItsSignThroughTheBlockQuantizer) {
  const uint16_t bf16[4] = {0xFFC1, 0x7FC1, 0xFF81, 0x3F80};  // -qNaN, +qNaN, -sNaN, 1.0
  const uint16_t f16[4] = {0xFE01, 0x7E01, 0xFC01, 0x3C00};
  for (auto [dt, src] :
       {std::pair<DType, const uint16_t*>{DType::kBF16, bf16}, {DType::kF16, f16}}) {
    uint8_t q[4];
    float s = 0;
    ASSERT_TRUE(QuantizeFp8Block(dt, src, 1, 4, 128, 128, q, &s).ok());
    EXPECT_EQ(q[0], 0xFF);
    EXPECT_EQ(q[1], 0x7F);
    EXPECT_EQ(q[2], 0xFF);
    EXPECT_EQ(q[3], 0x7E);  // 1.0 is the amax: 1 / (1/448) = 448
    EXPECT_EQ(s, 1.0f / 448.0f);
  }
}

}  // namespace
}  // namespace weightcache::load
