// The per-element maths of block-wise FP8 quantization, written once for both compilers:
// fp8_quant.cc (CPU, g++) and fp8_quant.cu (CUDA kernel, nvcc) include this header, so the
// host and device results are the SAME code, not two implementations kept in step. The
// contract is in pkg/load/fp8_quant.h.
//
// Everything here is integer-only after reading a float's bits, except a few IEEE float
// operations written out explicitly: the block scale `amax / 448.0f` and the element
// `x / scale`, both single divisions rounded to nearest even (on the device __fdiv_rn,
// correct whatever -prec-div / --use_fast_math say; on the host plain `/`, x86-64 SSE, no
// flush-to-zero: the process never sets FTZ/DAZ), and the exhaustively proven fast form of
// the element division at the end of this file (a multiply and two fused multiply-adds).
// Private to pkg/load. Thread-safety: pure inline functions.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define WC_FP8_HD __host__ __device__ __forceinline__
#else
#define WC_FP8_HD inline
#endif

namespace weightcache::load::internal {

inline constexpr uint32_t kFp8AbsMask = 0x7FFFFFFFu;
inline constexpr uint32_t kFp8InfBits = 0x7F800000u;
inline constexpr uint32_t kFp8MaxBits = 0x43E00000u;  // 448.0f

WC_FP8_HD uint32_t Fp8FloatBits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}

WC_FP8_HD float Fp8BitsFloat(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}

WC_FP8_HD float Fp8Div(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

// The IEEE operations of Fp8DivByReciprocal below, rounded to nearest even (no contraction
// on either side: fp8_quant.cu is built with -fmad=false, the host calls std::fma).
WC_FP8_HD float Fp8MulRn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

WC_FP8_HD float Fp8FmaRn(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}

// Exact widening conversions.
WC_FP8_HD float Fp8Bf16ToFloat(uint16_t bits) {
  return Fp8BitsFloat(static_cast<uint32_t>(bits) << 16);
}

WC_FP8_HD float Fp8HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu;
  uint32_t mant = h & 0x3FFu;
  if (exp == 0x1F) return Fp8BitsFloat(sign | kFp8InfBits | (mant << 13));  // inf / nan
  if (exp != 0) return Fp8BitsFloat(sign | ((exp + 112) << 23) | (mant << 13));
  if (mant == 0) return Fp8BitsFloat(sign);
  // Subnormal half: mant * 2^-24, a normal float.
  int e = -1;
  do {
    mant <<= 1;
    ++e;
  } while ((mant & 0x400u) == 0);
  return Fp8BitsFloat(sign | (static_cast<uint32_t>(112 - e) << 23) | ((mant & 0x3FFu) << 13));
}

// |x| if x is finite, else 0 (NaN and +-Inf take no part in a block's amax).
WC_FP8_HD float Fp8FiniteAbs(float x) {
  const uint32_t a = Fp8FloatBits(x) & kFp8AbsMask;
  return a < kFp8InfBits ? Fp8BitsFloat(a) : 0.0f;
}

// max of two non-negative, non-NaN floats: their bit patterns order like the values, so an
// integer max is exact and needs no float compare.
WC_FP8_HD float Fp8MaxAbs(float a, float b) {
  const uint32_t x = Fp8FloatBits(a), y = Fp8FloatBits(b);
  return Fp8BitsFloat(x > y ? x : y);
}

// Shifts `mant` right by `shift` (>= 1), rounding to nearest, ties to even.
WC_FP8_HD uint32_t Fp8ShiftRne(uint32_t mant, uint32_t shift) {
  if (shift >= 32) return 0;
  const uint32_t q = mant >> shift;
  const uint32_t rem = mant & ((1u << shift) - 1);
  const uint32_t half = 1u << (shift - 1);
  return q + ((rem > half || (rem == half && (q & 1u))) ? 1u : 0u);
}

// Nearest e4m3fn code, ties to even, saturating to +-448; NaN -> 0x7F | sign.
WC_FP8_HD uint8_t Fp8FloatToE4M3(float x) {
  const uint32_t bits = Fp8FloatBits(x);
  const uint8_t sign = static_cast<uint8_t>((bits >> 24) & 0x80u);
  const uint32_t abs = bits & kFp8AbsMask;
  if (abs > kFp8InfBits) return static_cast<uint8_t>(sign | 0x7Fu);   // NaN
  if (abs >= kFp8MaxBits) return static_cast<uint8_t>(sign | 0x7Eu);  // saturate, +-Inf
  const uint32_t e = abs >> 23;  // biased float exponent; 0 for float subnormals
  const uint32_t mant = (abs & 0x7FFFFFu) | (e != 0 ? 0x800000u : 0u);  // mant * 2^(E-150)
  const uint32_t big_e = e > 1 ? e : 1;
  if (big_e >= 121) {
    // Normal e4m3 (>= 2^-6): exponent big_e - 120 (bias 7), 3 mantissa bits.
    uint32_t m = Fp8ShiftRne(mant, 20);  // 8..16 (implicit bit included)
    uint32_t fe = big_e - 120;
    if (m == 16) {  // rounded up into the next binade
      m = 8;
      ++fe;
    }
    return static_cast<uint8_t>(sign | (fe << 3) | (m & 7u));  // < 448, so never 0x7F
  }
  // Subnormal e4m3: a multiple of 2^-9; a result of 8 is the smallest normal, code 0x08.
  const uint32_t q = Fp8ShiftRne(mant, 141 - big_e);
  return static_cast<uint8_t>(sign | q);
}

// The block's scale (weight_scale_inv) from its amax (finite, >= 0): amax / 448, or 1 for
// an all-zero block.
WC_FP8_HD float Fp8ScaleFromAmax(float amax) { return amax == 0.0f ? 1.0f : Fp8Div(amax, 448.0f); }

// One element. A NaN input is answered before the division: IEEE leaves the sign of a NaN
// quotient unspecified, and it differs in practice (x86 SSE keeps the input NaN and its
// sign; the GPU's __fdiv_rn returns the canonical positive NaN), so dividing first would
// make the host and the device disagree (0xFF vs 0x7F; seen on the H200).
WC_FP8_HD uint8_t Fp8QuantizeElement(float x, float scale) {
  const uint32_t bits = Fp8FloatBits(x);
  if ((bits & kFp8AbsMask) > kFp8InfBits)
    return static_cast<uint8_t>(((bits >> 24) & 0x80u) | 0x7Fu);
  return Fp8FloatToE4M3(Fp8Div(x, scale));
}

// ---- The fast form of Fp8QuantizeElement (the GPU kernel's hot loop) ----
//
// Fp8QuantizeElement divides every element by the block's scale (__fdiv_rn on the device: a
// reciprocal, two Newton corrections, a range check and a slow-path branch per element).
// The fast form below computes the quotient from the block's reciprocal y = RN(1/scale) with
// one multiply and one Markstein correction (3 IEEE operations per element). The quotient
// itself may differ from x / scale in its last bit (about 2.6 million of the 10^9 bf16
// pairs, none of them next to an e4m3 rounding boundary), but the CODE is the same: an
// exactly-equivalent form of Fp8QuantizeElement, not an approximation, on the domain where
// the kernel uses it:
//   - scale >= 2^-64 (Fp8FastScaleOk; codes first differ at scale < 2^-113, where the
//     correction's residual becomes a subnormal float; such blocks, amax < 448 * 2^-64,
//     take the plain path), and
//   - x is finite with |x| <= amax of its block (true by construction: amax is the largest
//     finite |x|; NaN and +-Inf elements take the plain path).
// That domain is finite and small: amax is itself one of the 2^15 non-negative 16-bit
// values (bf16 or f16) and x one of 2^16, so the equivalence is PROVEN by exhaustion, not by
// argument: every (amax, x) pair of both dtypes, 2^32 in all, gives the same code as
// Fp8QuantizeElement (fp8_quant_gpu_test Fp8Gpu.FastElementEqualsSharedFunctionExhaustively
// on the GPU, where the kernel runs it; zero mismatches).
WC_FP8_HD bool Fp8FastScaleOk(float scale) { return Fp8FloatBits(scale) >= 0x1F800000u; }

WC_FP8_HD float Fp8Reciprocal(float scale) {
#if defined(__CUDA_ARCH__)
  return __frcp_rn(scale);
#else
  return 1.0f / scale;
#endif
}

// RN(x / scale)'s e4m3 code's worth, given y = Fp8Reciprocal(scale), on the domain above.
// The quotient's sign is x's (scale > 0), copied explicitly: the sign of a zero produced by
// the correction depends on how a compiler folds the negations (g++ -O2 turned
// -(s*q0 - x) into x - s*q0, which makes -0.0 / scale come out +0.0), so only the
// magnitude is taken from the arithmetic.
WC_FP8_HD float Fp8DivByReciprocal(float x, float scale, float y) {
  const float q0 = Fp8MulRn(x, y);
  const float e = Fp8FmaRn(scale, q0, -x);
  const float q = Fp8FmaRn(-e, y, q0);
  return Fp8BitsFloat((Fp8FloatBits(q) & kFp8AbsMask) | (Fp8FloatBits(x) & ~kFp8AbsMask));
}

}  // namespace weightcache::load::internal
