// Online block-wise FP8 quantization on the CPU: bf16/fp16 weights -> float8_e4m3fn with a
// float32 scale per block (weight_scale_inv, DeepSeek's convention: dequant = fp8 * scale).
// The CUDA kernel must match it bit for bit, so the maths is written as small pure functions
// over integers and single IEEE float operations, one per element, easy to mirror:
//
//   amax   = max |x| over the block's finite elements (NaN and +-Inf ignored; max is
//            order-independent, so any reduction order gives the same value)
//   scale  = amax / 448.0f           (one IEEE float division, round to nearest even)
//            scale = 1.0f when amax == 0 (an all-zero block: every code is 0, dequant exact)
//   code   = FloatToE4M3(x / scale)  (one IEEE float division, then the integer rounding)
//
// FloatToE4M3 rounds to the nearest e4m3fn value, ties to even, with saturation: finite
// values of magnitude >= 448 and +-Inf become +-448 (0x7E / 0xFE; e4m3fn has no infinity and
// torch's plain cast would give NaN above 464); NaN becomes 0x7F with the input's sign bit
// (0x7F / 0xFF, as torch's cast); -0.0 stays 0x80. Subnormal results (multiples of 2^-9
// below 2^-6) are produced, never flushed. A CUDA mirror must be compiled without
// --use_fast_math (IEEE division: __fdiv_rn, no flush-to-zero of subnormal scales).
//
// Blocks are block_rows x block_cols tiles of the row-major [rows, cols] weight, starting at
// (0, 0); tiles on the bottom and right edges are ragged (smaller), and their amax covers
// only the elements that exist. The scale tensor is row-major [ceil(rows/block_rows),
// ceil(cols/block_cols)].
// Thread-safety: pure functions.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "pkg/safetensors/safetensors.h"

namespace weightcache::load {

inline constexpr float kFp8E4M3Max = 448.0f;

// Exact widening conversions.
float Bf16ToFloat(uint16_t bits);
float HalfToFloat(uint16_t bits);
// Decodes an e4m3fn code (0x7F / 0xFF are NaN).
float E4M3ToFloat(uint8_t code);

// Nearest e4m3fn code, ties to even, saturating (see above). Integer-only after reading the
// float's bits.
uint8_t FloatToE4M3(float x);

// The block's scale from its amax (finite, >= 0).
float Fp8BlockScale(float amax);

// One element: FloatToE4M3(x / scale).
inline uint8_t QuantizeElement(float x, float scale) { return FloatToE4M3(x / scale); }

// Quantizes a row-major [rows, cols] BF16 or F16 matrix `src` into `out_fp8` (rows * cols
// codes, row-major) and `out_scale_inv` (ceil(rows/block_rows) * ceil(cols/block_cols)
// floats, row-major). INVALID_ARGUMENT for another dtype or non-positive block sizes.
absl::Status QuantizeFp8Block(safetensors::DType src_dtype, const void* src, int64_t rows,
                              int64_t cols, int block_rows, int block_cols, uint8_t* out_fp8,
                              float* out_scale_inv);

}  // namespace weightcache::load
