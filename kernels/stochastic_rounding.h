// Counter-based random numbers and stochastic rounding to FP4 E2M1, one header for the
// CPU reference and the CUDA kernels (TESERVE_HD, no abseil, no state).
//
// Random bits. A draw is a pure function of (seed, stream, copy, index), so any thread
// can compute the draw of any element without sequencing, and the CPU and a GPU get the
// same bits:
//   key     = Mix64(Mix64(Mix64(seed ^ kSeedSalt) ^ stream) ^ copy)
//   bits64  = Mix64(key + (index + 1) * kGoldenGamma)
//   u24     = bits64 >> 40                        (the top 24 bits)
//   uniform = u24 * 2^-24, exactly representable in FP32, in [0, 1)
// Mix64 is the SplitMix64 output function (a bijection of 64-bit words with strong
// avalanche); feeding it key + n * gamma is the SplitMix64 sequence read at position n,
// which is what makes it counter-based. `seed` is Context::seed, `stream` separates ops
// sharing a seed, `copy` separates the rowwise (0) and columnwise (1) copies, `index` is
// the element's linear index in the copy being written.
//
// Stochastic rounding of y (the block-scaled value, FP32) to E2M1. Let a = |y|.
//   a >= 6, Inf or NaN: as FloatToE2M1 (saturate to 6; NaN -> code 0x7).
//   else lo = the largest E2M1 value <= a, hi = the next one, gap = hi - lo (0.5, 1 or 2)
//        p  = (a - lo) / gap        (exact in FP32: Sterbenz, and gap is a power of two)
//        round to hi when uniform < p, else to lo; the sign of y is kept (-0 stays -0).
// P(hi) = ceil(p * 2^24) / 2^24, so E[result] = a up to gap * 2^-24: unbiased for all
// practical purposes, and the result is always one of the two neighbours. Values
// already on the grid (p = 0) never move.
#ifndef TESERVE_KERNELS_STOCHASTIC_ROUNDING_H_
#define TESERVE_KERNELS_STOCHASTIC_ROUNDING_H_

#include <cstdint>

#include "core/float_codec.h"

namespace teserve {
namespace kernels {

inline constexpr uint64_t kGoldenGamma = 0x9E3779B97F4A7C15ull;
inline constexpr uint64_t kSeedSalt = 0x5445534552564553ull;  // "TESERVES"

TESERVE_HD uint64_t Mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Copy ids of the `copy` argument.
inline constexpr uint32_t kRowwiseCopyId = 0;
inline constexpr uint32_t kColumnwiseCopyId = 1;

TESERVE_HD uint64_t RandomKey(uint64_t seed, uint64_t stream, uint32_t copy) {
  return Mix64(Mix64(Mix64(seed ^ kSeedSalt) ^ stream) ^ copy);
}

// 24 uniform random bits for element `index` under `key`.
TESERVE_HD uint32_t RandomBits24(uint64_t key, uint64_t index) {
  return static_cast<uint32_t>(Mix64(key + (index + 1) * kGoldenGamma) >> 40);
}

TESERVE_HD float Uniform24ToFloat(uint32_t u24) {
  return static_cast<float>(u24 & 0xFFFFFFu) * 0x1p-24f;
}

// E2M1 code (low nibble) of y rounded stochastically with the draw `u24`.
TESERVE_HD uint8_t StochasticRoundToE2M1(float y, uint32_t u24) {
  const uint32_t bits = FloatBits(y);
  const float a = BitsToFloat(bits & 0x7FFFFFFFu);
  if (!(a < kE2M1Max)) return FloatToE2M1(y);  // saturation, Inf, NaN
  // Magnitude code of the lower neighbour: 0..3 step 0.5, 4..5 step 1, 6 is 4.0.
  uint32_t code;
  float lo;
  float gap;
  if (a < 2.0f) {
    code = static_cast<uint32_t>(a * 2.0f);  // truncation of a non-negative value
    lo = static_cast<float>(code) * 0.5f;
    gap = 0.5f;
  } else if (a < 4.0f) {
    code = 4u + static_cast<uint32_t>(a - 2.0f);
    lo = static_cast<float>(code - 2u);
    gap = 1.0f;
  } else {
    code = 6u;
    lo = 4.0f;
    gap = 2.0f;
  }
  const float p = (a - lo) / gap;
  if (Uniform24ToFloat(u24) < p) ++code;
  return static_cast<uint8_t>(code | ((bits >> 28) & 0x8u));
}

}  // namespace kernels
}  // namespace teserve

#endif  // TESERVE_KERNELS_STOCHASTIC_ROUNDING_H_
