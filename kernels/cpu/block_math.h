// Small arithmetic shared by the reference kernels (and the block-scaling checks in
// //kernels): the NaN-propagating amax every quantizer uses, and block-count division.
// Amax keeps a NaN once seen (one NaN makes the block amax NaN, which the recipes treat
// as "keep the old scale"); -0.0 contributes 0.
#ifndef TESERVE_KERNELS_CPU_BLOCK_MATH_H_
#define TESERVE_KERNELS_CPU_BLOCK_MATH_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "absl/types/span.h"

namespace teserve {
namespace kernels {
namespace cpu {

// max(acc, |v|), NaN once either is NaN.
inline float AbsMaxUpdate(float acc, float v) {
  if (std::isnan(acc) || std::isnan(v)) return std::numeric_limits<float>::quiet_NaN();
  return std::max(acc, std::fabs(v));
}

inline float AmaxOf(absl::Span<const float> values) {
  float amax = 0.0f;
  for (float v : values) amax = AbsMaxUpdate(amax, v);
  return amax;
}

inline int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
inline int64_t RoundUp(int64_t a, int64_t b) { return CeilDiv(a, b) * b; }

}  // namespace cpu
}  // namespace kernels
}  // namespace teserve

#endif  // TESERVE_KERNELS_CPU_BLOCK_MATH_H_
