// L2 normalization over the last dimension (TE's L2Normalization, the parameter-free
// qk_norm_type "L2Normalization"), forward and backward.
//
// x: FP32 [n, h], h > 0; eps finite >= 0 (TE's default 1e-6).
//   rsigma[i] = 1 / sqrt(sum_j x[i, j]^2 + eps)     (the sum, not the mean: unit L2 norm)
//   y[i, j]   = x[i, j] * rsigma[i]
// rsigma is FP32 [n], saved for the backward pass, which returns
//   dx[i, j] = rsigma[i] * dy[i, j] - rsigma[i]^3 * x[i, j] * sum_k dy[i, k] x[i, k].
// A zero row with eps = 0 has rsigma = inf and gives NaN, as x / 0 does in TE.
// Reductions accumulate in FP64 on the CPU; outputs are rounded once to FP32.
#ifndef TESERVE_KERNELS_L2_NORM_H_
#define TESERVE_KERNELS_L2_NORM_H_

#include "absl/status/statusor.h"
#include "core/context.h"
#include "core/tensor.h"

namespace teserve {
namespace kernels {

struct L2NormForwardOutputs {
  Tensor y;       // [n, h]
  Tensor rsigma;  // [n]
};

absl::StatusOr<L2NormForwardOutputs> L2NormalizationForward(const Context& ctx, const Tensor& x, float eps);

// dy and x [n, h], rsigma [n] from the forward; returns dx [n, h].
absl::StatusOr<Tensor> L2NormalizationBackward(const Context& ctx, const Tensor& dy, const Tensor& x,
                                               const Tensor& rsigma);

}  // namespace kernels
}  // namespace teserve

#endif  // TESERVE_KERNELS_L2_NORM_H_
