// CPU reference for kernels/normalization.h: LayerNorm and RMSNorm forward/backward.
//
// Assumes the metadata checks of kernels/normalization.cc have passed (FP32, [n, h]
// inputs with [h] parameters and [n] statistics, h > 0, CPU tensors); call the
// kernels:: entry points for checked use.
#ifndef TESERVE_KERNELS_CPU_NORMALIZATION_CPU_H_
#define TESERVE_KERNELS_CPU_NORMALIZATION_CPU_H_

#include "absl/status/statusor.h"
#include "core/context.h"
#include "core/tensor.h"
#include "kernels/normalization.h"

namespace teserve {
namespace kernels {
namespace cpu {

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

// Extended entry points (kernels/normalization.h): inputs of any high-precision dtype are
// widened to FP32 (exactly), normalized by the FP32 functions above, then y is quantized
// with cpu::QuantizePerTensor and/or rounded to y_dtype with cpu::CastFromFloat32. dx is
// rounded to x's dtype. sm_margin is ignored.
absl::StatusOr<NormForwardResult> NormalizationForward(const Context& ctx, NormType type,
                                                       const Tensor& x, const Tensor& gamma,
                                                       const Tensor& beta,
                                                       const NormForwardOptions& options);

absl::StatusOr<NormBackwardOutputs> NormalizationBackward(const Context& ctx, NormType type,
                                                          const Tensor& dy, const Tensor& x,
                                                          const Tensor& mu, const Tensor& rsigma,
                                                          const Tensor& gamma,
                                                          const NormBackwardOptions& options);

}  // namespace cpu
}  // namespace kernels
}  // namespace teserve

#endif  // TESERVE_KERNELS_CPU_NORMALIZATION_CPU_H_
