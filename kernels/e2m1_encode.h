// Branch-free FP4 E2M1 encoders for the NVFP4 kernels: the same codes as the integer
// codec FloatToE2M1 (core/float_codec.h) and StochasticRoundToE2M1
// (kernels/stochastic_rounding.h) in about a dozen integer and FP32 operations instead of a
// general rounding routine. tests/kernels/e2m1_encode_test.cc proves the equality on
// every FP32 bit pattern (nearest) and on the NVFP4 range x a set of draws (stochastic).
// One header for the CPU reference and the CUDA kernels (TESERVE_HD).
//
// Nearest (RNE, satfinite). With a = |y|, m = max(2^floor(log2 a), 1) (from the
// exponent bits) and g = 1 / m * 2 (the inverse of the E2M1 quantum around a: 2 below
// 2, 1 in [2, 4), 0.5 in [4, 8)):
//   q    = RNE(a * g)            a * g + 2^23 in one FP32 rounding (a * g is exact)
//   code = min(q + 2 log2 m, 7)  q indexes the binade (q = 4 at its top is the next
//                                binade's first code), 7 saturates.
// Huge magnitudes get a tiny g and a large offset (7); +Inf gives Inf * 0 = NaN and NaN
// stays NaN, whose bits minus 2^23's exceed 7 as unsigned (7). The sign bit is kept
// except for NaN, which FloatToE2M1 encodes as plain 0x7.
//
// Stochastic. For a < 6 the lower neighbour lo is a with its mantissa cut to one bit
// (a >= 1), 0.5 (0.5 <= a < 1) or 0; its code is (bits(lo) >> 22) - 0xFC for lo >= 1.
// The gap to the upper neighbour is 2^max(0, floor(log2 a)) / 2, so
// p = (a - lo) * (1 / gap) is the exact quotient of StochasticRoundToE2M1 (a - lo is
// exact, 1 / gap a power of two); round up when u24 * 2^-24 < p. a >= 6, Inf and NaN
// take the nearest encoder's result (saturation; NaN -> 0x7).
//
// Random draws. RandomCounter(key, index) = key + (index + 1) * kGoldenGamma (mod 2^64)
// and RandomBits24OfCounter(counter) = RandomBits24(key, index); consecutive indices
// step the counter by kGoldenGamma, so a kernel can advance it with one 64-bit add.
#ifndef TESERVE_KERNELS_E2M1_ENCODE_H_
#define TESERVE_KERNELS_E2M1_ENCODE_H_

#include <cstdint>

#include "core/float_codec.h"
#include "kernels/stochastic_rounding.h"

namespace teserve {
namespace kernels {

// Sign nibble bit of y's code: 0x8 for negative y, 0 for NaN (FloatToE2M1 drops it).
TESERVE_HD uint32_t E2M1SignOf(uint32_t bits) {
  const uint32_t abs_bits = bits & 0x7FFFFFFFu;
  return abs_bits > 0x7F800000u ? 0u : (bits >> 28) & 0x8u;
}

// == FloatToE2M1(y) for every y.
TESERVE_HD uint32_t E2M1EncodeNearest(float y) {
  const uint32_t bits = FloatBits(y);
  const uint32_t exp_bits = bits & 0x7F800000u;
  const uint32_t m_bits = exp_bits > 0x3F800000u ? exp_bits : 0x3F800000u;
  const float a = BitsToFloat(bits & 0x7FFFFFFFu);
  const float g = BitsToFloat(0x7F800000u - m_bits);
#if defined(__CUDA_ARCH__)
  const float t = __fmaf_rn(a, g, 0x1p23f);
#else
  const float t = a * g + 0x1p23f;  // a * g is exact: one rounding
#endif
  const uint32_t q = FloatBits(t) - 0x4B000000u + ((m_bits - 0x3F800000u) >> 22);
  return (q < 0x7u ? q : 0x7u) | E2M1SignOf(bits);
}

// == StochasticRoundToE2M1(y, u24) for every y and every draw u24 < 2^24.
TESERVE_HD uint32_t E2M1EncodeStochastic(float y, uint32_t u24) {
  const uint32_t bits = FloatBits(y);
  const uint32_t a_bits = bits & 0x7FFFFFFFu;
  const float a = BitsToFloat(a_bits);
  // Lower neighbour and its magnitude code (meaningful for a < 6).
  const bool at_least_one = a_bits >= 0x3F800000u;
  const bool at_least_half = a_bits >= 0x3F000000u;
  const uint32_t lo_bits =
      at_least_one ? (a_bits & 0xFFC00000u) : (at_least_half ? 0x3F000000u : 0u);
  const uint32_t lo_code =
      at_least_one ? (lo_bits >> 22) - 0xFCu : static_cast<uint32_t>(at_least_half);
  // 1 / gap: 2 below 2, 1 in [2, 4), 0.5 in [4, 8).
  const uint32_t exp_bits = a_bits & 0x7F800000u;
  const uint32_t inv_gap_bits = 0x7F800000u - (exp_bits > 0x3F800000u ? exp_bits : 0x3F800000u);
#if defined(__CUDA_ARCH__)
  const float p = __fmul_rn(__fsub_rn(a, BitsToFloat(lo_bits)), BitsToFloat(inv_gap_bits));
  const float uniform = __fmul_rn(static_cast<float>(u24 & 0xFFFFFFu), 0x1p-24f);
#else
  const float p = (a - BitsToFloat(lo_bits)) * BitsToFloat(inv_gap_bits);
  const float uniform = static_cast<float>(u24 & 0xFFFFFFu) * 0x1p-24f;
#endif
  const uint32_t code = lo_code + static_cast<uint32_t>(uniform < p);
  return (a_bits >= 0x40C00000u ? 0x7u : code) | E2M1SignOf(bits);
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
