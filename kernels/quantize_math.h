// Per-block scale arithmetic of the block-scaled recipes, shared by the CPU reference
// (kernels/cpu) and the CUDA kernels (kernels/cuda) so both compute the same bits:
// the MXFP8 E8M0 code and encode factor, the FP8 block-scaling scale, the NVFP4 block
// decode scale and encode factor, and the byte order of swizzled MXFP8 scales. The formulas are those of
// kernels/block_quantize.h and kernels/nvfp4.h.
//
// Header-only and free of abseil (nvcc compiles it). FP32 division and multiplication
// go through DivRn / MulRn: on the device they are the IEEE round-to-nearest intrinsics,
// which nvcc never contracts into FMAs or replaces with approximations whatever the
// flags; on the host they are the plain operators (SSE, no contraction under -std=c++17).
#ifndef TESERVE_KERNELS_QUANTIZE_MATH_H_
#define TESERVE_KERNELS_QUANTIZE_MATH_H_

#include <cfloat>
#include <cstdint>

#include "core/float_codec.h"

namespace teserve {
namespace kernels {

TESERVE_HD float DivRn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

TESERVE_HD float MulRn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

// Neither Inf nor NaN.
TESERVE_HD bool IsFiniteBits(float x) { return (FloatBits(x) & 0x7FFFFFFFu) < 0x7F800000u; }

// E8M0 code of an MXFP8 block: 2^code-127 >= block_amax / fp8_max, the smallest such
// power of two (0xFF when the amax is NaN).
TESERVE_HD uint8_t Mxfp8ScaleCode(float block_amax, float fp8_max) {
  return FloatToE8M0RoundUp(DivRn(block_amax, fp8_max));
}

// 2^(127 - code), built from bits: brings the block under fp8_max. Codes 0 (factor
// 2^127) and 254 (2^-127, an FP32 subnormal) need no special case. NaN for 0xFF, so a
// block holding a NaN encodes entirely as NaN.
TESERVE_HD float Mxfp8EncodeFactor(uint8_t code) {
  if (code == 0xFFu) return BitsToFloat(0x7FC00000u);
  return E8M0ToFloat(static_cast<uint8_t>(0xFEu - code));
}

// FP8 block scaling: the scale (not its inverse) of a block with amax `block_amax`.
//   a = max(block_amax, amax_epsilon); 1 when a is 0, Inf or NaN; else fp8_max / a
//   (RNE), Inf clamped to FLT_MAX, and with power_2_scale the mantissa cleared.
TESERVE_HD float BlockScalingScaleOf(float block_amax, float fp8_max, bool power_2_scale,
                                     float amax_epsilon) {
  const float amax = block_amax < amax_epsilon ? amax_epsilon : block_amax;
  if (amax == 0.0f || !IsFiniteBits(amax)) return 1.0f;
  float scale = DivRn(fp8_max, amax);
  if (!IsFiniteBits(scale)) scale = FLT_MAX;  // amax > 0 finite: only +Inf gets here
  if (power_2_scale) scale = BitsToFloat(FloatBits(scale) & 0xFF800000u);
  return scale;
}

// NVFP4 block scale from the block amax and the global encode scale S (inv_s = 1 / S):
//   byte = E4M3((block_amax / 6) * S), sd = decode(byte),
//   e    = sd > 0 ? min(1 / (sd * inv_s), FLT_MAX) : 0.
struct Nvfp4BlockScale {
  uint8_t byte;  // stored E4M3 decode scale
  float e;       // encode factor applied to x
};

TESERVE_HD Nvfp4BlockScale Nvfp4BlockScaleOf(float block_amax, float s, float inv_s) {
  Nvfp4BlockScale b;
  b.byte = FloatToE4M3(MulRn(DivRn(block_amax, 6.0f), s));
  const float sd = E4M3ToFloat(b.byte);
  b.e = 0.0f;
  if (sd > 0.0f) {
    const float e = DivRn(1.0f, MulRn(sd, inv_s));
    b.e = e < FLT_MAX ? e : FLT_MAX;
  }
  return b;
}

// Byte offset of E8M0 scale (r, c) in cuBLASLt's VEC32_UE8M0 layout of a scale matrix
// padded to `padded_cols` (a multiple of 4) columns: 128x4 tiles of 512 bytes in
// row-major tile order; inside a tile, row r sits in 16-byte line r % 32 at column
// group r / 32 (kernels/block_quantize.h, SwizzleMxfp8Scales).
TESERVE_HD int64_t Mxfp8SwizzledOffset(int64_t r, int64_t c, int64_t padded_cols) {
  constexpr int64_t kTileRows = 128;
  constexpr int64_t kTileCols = 4;
  constexpr int64_t kRowGroup = 32;
  constexpr int64_t kTileBytes = kTileRows * kTileCols;
  const int64_t tile = (r / kTileRows) * (padded_cols / kTileCols) + c / kTileCols;
  const int64_t tr = r % kTileRows;
  return tile * kTileBytes + (tr % kRowGroup) * (kTileBytes / kRowGroup) +
         (tr / kRowGroup) * kTileCols + c % kTileCols;
}

}  // namespace kernels
}  // namespace teserve

#endif  // TESERVE_KERNELS_QUANTIZE_MATH_H_
