// The per-tensor scale rules as scalar code shared by the CPU reference and the CUDA
// kernels (the delayed-scaling update of kernels/delayed_scaling.h, current scaling's scale
// from a tensor's own amax), so both compute the same bits. Header-only, no abseil.
#ifndef TESERVE_KERNELS_SCALING_MATH_H_
#define TESERVE_KERNELS_SCALING_MATH_H_

#include <cfloat>
#include <cstdint>

#include "core/float_codec.h"

namespace teserve {
namespace kernels {
namespace scaling_math {

TESERVE_HD bool IsNan(float x) { return (FloatBits(x) & 0x7FFFFFFFu) > 0x7F800000u; }

// max(a, b), NaN if either is NaN (std::max(a, b) otherwise: a unless a < b).
TESERVE_HD float NanMax(float a, float b) {
  if (IsNan(a) || IsNan(b)) return BitsToFloat(0x7FC00000u);
  return a < b ? b : a;
}

// (fp8_max / amax) / margin_factor, or `previous` when amax is not finite and > 0; an
// infinite result becomes FLT_MAX.
TESERVE_HD float DelayedScale(float amax, float fp8_max, float margin_factor, float previous) {
  const uint32_t abs_bits = FloatBits(amax) & 0x7FFFFFFFu;
  if (!(amax > 0.0f) || abs_bits >= 0x7F800000u) return previous;
#if defined(__CUDA_ARCH__)
  const float scale = __fdiv_rn(__fdiv_rn(fp8_max, amax), margin_factor);
#else
  const float scale = (fp8_max / amax) / margin_factor;
#endif
  return (FloatBits(scale) & 0x7FFFFFFFu) == 0x7F800000u ? FLT_MAX : scale;
}

// Current scaling: fp8_max / max(amax, amax_epsilon); 1 when that floor is not finite and
// > 0 (NaN, Inf, or 0 with no epsilon); an infinite result becomes FLT_MAX; power_2 rounds
// the scale down to a power of two (mantissa bits cleared).
TESERVE_HD float CurrentScale(float amax, float fp8_max, float amax_epsilon, bool power_2) {
  const float floored = IsNan(amax) ? amax : (amax < amax_epsilon ? amax_epsilon : amax);
  if (!(floored > 0.0f) || (FloatBits(floored) & 0x7FFFFFFFu) >= 0x7F800000u) return 1.0f;
#if defined(__CUDA_ARCH__)
  float scale = __fdiv_rn(fp8_max, floored);
#else
  float scale = fp8_max / floored;
#endif
  if ((FloatBits(scale) & 0x7FFFFFFFu) == 0x7F800000u) scale = FLT_MAX;
  if (power_2) scale = BitsToFloat(FloatBits(scale) & 0xFF800000u);
  return scale;
}

}  // namespace scaling_math
}  // namespace kernels
}  // namespace teserve

#endif  // TESERVE_KERNELS_SCALING_MATH_H_
