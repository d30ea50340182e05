// LayerNorm and RMSNorm, forward and backward, over the last dimension.
//
// x: FP32 [n, h]; gamma, beta: FP32 [h]. With zero_centered_gamma the effective
// weight is (1 + gamma) (TE's zero_centered_gamma).
//   LayerNorm: mu = mean(x), rsigma = 1 / sqrt(var(x) + eps) (biased variance),
//              y = (x - mu) * rsigma * w + beta.
//   RMSNorm:   rsigma = 1 / sqrt(mean(x^2) + eps), y = x * rsigma * w.
// mu and rsigma are FP32 [n], saved for the backward pass.
// Backward returns dx [n, h] and the parameter gradients dgamma (and dbeta) [h]
// (fresh values, not accumulated). Reductions accumulate in FP64 on the CPU.
#ifndef TESERVE_KERNELS_NORMALIZATION_H_
#define TESERVE_KERNELS_NORMALIZATION_H_

#include "absl/status/statusor.h"
#include "core/context.h"
#include "core/tensor.h"

namespace teserve {
namespace kernels {

struct NormForwardOutputs {
  Tensor y;       // [n, h]
  Tensor mu;      // [n] (LayerNorm only)
  Tensor rsigma;  // [n]
};

struct NormBackwardOutputs {
  Tensor dx;      // [n, h]
  Tensor dgamma;  // [h]
  Tensor dbeta;   // [h] (LayerNorm only)
};

absl::StatusOr<NormForwardOutputs> LayerNormForward(const Context& ctx, const Tensor& x,
                                                    const Tensor& gamma, const Tensor& beta,
                                                    float eps, bool zero_centered_gamma);

absl::StatusOr<NormBackwardOutputs> LayerNormBackward(const Context& ctx, const Tensor& dy,
                                                      const Tensor& x, const Tensor& mu,
                                                      const Tensor& rsigma, const Tensor& gamma,
                                                      bool zero_centered_gamma);

absl::StatusOr<NormForwardOutputs> RmsNormForward(const Context& ctx, const Tensor& x,
                                                  const Tensor& gamma, float eps,
                                                  bool zero_centered_gamma);

absl::StatusOr<NormBackwardOutputs> RmsNormBackward(const Context& ctx, const Tensor& dy,
                                                    const Tensor& x, const Tensor& rsigma,
                                                    const Tensor& gamma, bool zero_centered_gamma);

}  // namespace kernels
}  // namespace teserve

#endif  // TESERVE_KERNELS_NORMALIZATION_H_
