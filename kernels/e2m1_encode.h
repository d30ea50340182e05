// Branch-free FP4 E2M1 encoders (and E4M3 block-scale codecs) for the NVFP4 kernels:
// the same codes as the integer codecs of core/float_codec.h (FloatToE2M1, FloatToE4M3,
// E4M3ToFloat) and StochasticRoundToE2M1 (kernels/stochastic_rounding.h), in about a
// dozen integer and FP32 operations instead of a general rounding routine.
// tests/kernels/e2m1_encode_test.cc proves the equality on every FP32 bit pattern
// (nearest E2M1, E4M3), every byte (E4M3 decode) and on the NVFP4 range x a set of
// draws (stochastic). One header for the CPU reference and the CUDA kernels (TESERVE_HD).
//
// Nearest (RNE, satfinite). With a = |y|, m = max(2^floor(log2 a), 1) (from the
// exponent bits) and g = 1 / m * 2 (the inverse of the E2M1 quantum around a: 2 below
// 2, 1 in [2, 4), 0.5 in [4, 8)):
//   q    = RNE(a * g)            a * g + 2^23 in one FP32 rounding (a * g is exact)
//   code = min(q + 2 log2 m, 7)  q indexes the binade (q = 4 at its top is the next
//                                binade's first code), 7 saturates.
// y is first clamped to min(y, 8) with NaN -> 8 (ClampE2M1Input), which changes no
// code (all of y >= 6 and NaN encode as plain 0x7) and leaves only finite values and
// -Inf; -Inf gets g = 0 and Inf * 0 = NaN, whose bits minus 2^23's exceed 7 as unsigned
// (7, with the sign).
//
// Stochastic. For a < 6 the lower neighbour lo is a with its mantissa cut to one bit
// (a >= 1), 0.5 (0.5 <= a < 1) or 0; its code is (bits(lo) >> 22) - 0xFC for lo >= 1.
// The gap to the upper neighbour is 2^max(0, floor(log2 a)) / 2, so
// p = (a - lo) * (1 / gap) is the exact quotient of StochasticRoundToE2M1 (a - lo is
// exact, 1 / gap a power of two); round up when u24 * 2^-24 < p, evaluated as
// u24 < (a - lo) * (2^24 / gap) (both sides scaled by 2^24, exactly). After the same clamp,
// a >= 6 and -Inf saturate to 7 (NaN -> plain 0x7).
//
// Block scales. E4M3EncodeFast is the same magic-number rounding with 3 mantissa bits
// and E4M3's minimum normal 2^-6 (quantum 2^(max(floor(log2 a), -6) - 3), offset
// 8 * (max(floor(log2 a), -6) + 6)), saturating at 0x7E; NaN -> 0x7F. E4M3DecodeFast
// reads a non-NaN code as an FP32 whose exponent field is the code's (normal or
// subnormal alike) and multiplies by 2^120 (exact). Nvfp4BlockScaleFast is
// Nvfp4BlockScaleOf (kernels/quantize_math.h) through these two.
//
// Random draws. RandomCounter(key, index) = key + (index + 1) * kGoldenGamma (mod 2^64)
// and RandomBits24OfCounter(counter) = RandomBits24(key, index); consecutive indices
// step the counter by kGoldenGamma, so a kernel can advance it with one 64-bit add.
#ifndef TESERVE_KERNELS_E2M1_ENCODE_H_
#define TESERVE_KERNELS_E2M1_ENCODE_H_

#include <cfloat>
#include <cstdint>

#include "core/float_codec.h"
#include "kernels/quantize_math.h"
#include "kernels/stochastic_rounding.h"

namespace teserve {
namespace kernels {

// min(y, 8) with NaN -> 8: every code of y >= 6 is 7 and FloatToE2M1 encodes NaN as
// plain 0x7, so the clamp removes the NaN case from the encoders without changing a
// code (one FMNMX on the device).
TESERVE_HD float ClampE2M1Input(float y) {
#if defined(__CUDA_ARCH__)
  return fminf(y, 8.0f);
#else
  return y < 8.0f ? y : 8.0f;
#endif
}

// == FloatToE2M1(y) for every y.
TESERVE_HD uint32_t E2M1EncodeNearest(float y) {
  const float c = ClampE2M1Input(y);
  const uint32_t bits = FloatBits(c);
  const uint32_t exp_bits = bits & 0x7F800000u;
  const uint32_t m_bits = exp_bits > 0x3F800000u ? exp_bits : 0x3F800000u;
  const float g = BitsToFloat(0x7F800000u - m_bits);
#if defined(__CUDA_ARCH__)
  const float t = __fmaf_rn(fabsf(c), g, 0x1p23f);
#else
  const float t = BitsToFloat(bits & 0x7FFFFFFFu) * g + 0x1p23f;  // exact product: one rounding
#endif
  const uint32_t q = FloatBits(t) - (0x4B000000u + 0xFEu) + (m_bits >> 22);
  return (q < 0x7u ? q : 0x7u) | ((bits >> 28) & 0x8u);
}

// == StochasticRoundToE2M1(y, u24) for every y and every draw u24 < 2^24.
TESERVE_HD uint32_t E2M1EncodeStochastic(float y, uint32_t u24) {
  const uint32_t bits = FloatBits(ClampE2M1Input(y));
  const uint32_t a_bits = bits & 0x7FFFFFFFu;
  const float a = BitsToFloat(a_bits);
  // Lower neighbour and its magnitude code (meaningful for a < 6).
  const bool at_least_one = a_bits >= 0x3F800000u;
  const bool at_least_half = a_bits >= 0x3F000000u;
  const uint32_t lo_bits =
      at_least_one ? (a_bits & 0xFFC00000u) : (at_least_half ? 0x3F000000u : 0u);
  const uint32_t lo_code =
      at_least_one ? (lo_bits >> 22) - 0xFCu : static_cast<uint32_t>(at_least_half);
  // 2^24 / gap: 2^25 below 2, 2^24 in [2, 4), 2^23 in [4, 8). u24 * 2^-24 < p is
  // u24 < p * 2^24 (exact power-of-two scalings of both sides).
  const uint32_t exp_bits = a_bits & 0x7F800000u;
  const uint32_t scaled_inv_gap_bits =
      (0x7F800000u + (24u << 23)) - (exp_bits > 0x3F800000u ? exp_bits : 0x3F800000u);
#if defined(__CUDA_ARCH__)
  const float p24 =
      __fmul_rn(__fsub_rn(a, BitsToFloat(lo_bits)), BitsToFloat(scaled_inv_gap_bits));
#else
  const float p24 = (a - BitsToFloat(lo_bits)) * BitsToFloat(scaled_inv_gap_bits);
#endif
  const uint32_t code = lo_code + static_cast<uint32_t>(static_cast<float>(u24 & 0xFFFFFFu) < p24);
  return (a_bits >= 0x40C00000u ? 0x7u : code) | ((bits >> 28) & 0x8u);
}

// == FloatToE4M3(x) for every x.
TESERVE_HD uint32_t E4M3EncodeFast(float x) {
  const uint32_t bits = FloatBits(x);
  const uint32_t abs_bits = bits & 0x7FFFFFFFu;
  const uint32_t exp_bits = bits & 0x7F800000u;
  const uint32_t m_bits = exp_bits > 0x3C800000u ? exp_bits : 0x3C800000u;  // >= 2^-6
  const float a = BitsToFloat(abs_bits);
  const float g = BitsToFloat(0x80800000u - m_bits);  // 2^3 / m
#if defined(__CUDA_ARCH__)
  const float t = __fmaf_rn(a, g, 0x1p23f);
#else
  const float t = a * g + 0x1p23f;  // a * g is exact: one rounding
#endif
  const uint32_t q = FloatBits(t) - 0x4B000000u + ((m_bits - 0x3C800000u) >> 20);
  if (abs_bits > 0x7F800000u) return 0x7Fu;
  return (q < 0x7Eu ? q : 0x7Eu) | ((bits >> 24) & 0x80u);
}

// == E4M3ToFloat(code) bit for bit, for every byte. The subnormal codes (mag < 8) go
// through an FP32 subnormal operand (mag << 20), so this must not be compiled with
// flush-to-zero (-ftz=true / --use_fast_math): it would decode them as 0.
TESERVE_HD float E4M3DecodeFast(uint32_t code) {
  const uint32_t mag = code & 0x7Fu;
  const uint32_t sign = (code & 0x80u) << 24;
  if (mag == 0x7Fu) return BitsToFloat(0x7FC00000u | sign);
#if defined(__CUDA_ARCH__)
  const float v = __fmul_rn(BitsToFloat(mag << 20), 0x1p120f);
#else
  const float v = BitsToFloat(mag << 20) * 0x1p120f;
#endif
  return BitsToFloat(FloatBits(v) | sign);
}

// == Nvfp4BlockScaleOf(block_amax, s, inv_s) (same operations, fast E4M3 codecs).
TESERVE_HD Nvfp4BlockScale Nvfp4BlockScaleFast(float block_amax, float s, float inv_s) {
  Nvfp4BlockScale b;
  b.byte = static_cast<uint8_t>(E4M3EncodeFast(MulRn(DivRn(block_amax, 6.0f), s)));
  const float sd = E4M3DecodeFast(b.byte);
  b.e = 0.0f;
  if (sd > 0.0f) {
    const float e = DivRn(1.0f, MulRn(sd, inv_s));
    b.e = e < FLT_MAX ? e : FLT_MAX;
  }
  return b;
}

TESERVE_HD uint64_t RandomCounter(uint64_t key, uint64_t index) {
  return key + (index + 1) * kGoldenGamma;
}

TESERVE_HD uint32_t RandomBits24OfCounter(uint64_t counter) {
  return static_cast<uint32_t>(Mix64(counter) >> 40);
}

}  // namespace kernels
}  // namespace teserve

#endif  // TESERVE_KERNELS_E2M1_ENCODE_H_
