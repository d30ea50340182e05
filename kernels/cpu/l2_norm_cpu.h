// CPU reference for kernels/l2_norm.h: L2 normalization forward/backward.
//
// Assumes the metadata checks of kernels/l2_norm.cc have passed (FP32 [n, h] inputs
// with h > 0, [n] rsigma, CPU tensors); call the kernels:: entry points for checked use.
#ifndef TESERVE_KERNELS_CPU_L2_NORM_CPU_H_
#define TESERVE_KERNELS_CPU_L2_NORM_CPU_H_

#include "absl/status/statusor.h"
#include "core/context.h"
#include "core/tensor.h"
#include "kernels/l2_norm.h"

namespace teserve {
namespace kernels {
namespace cpu {

absl::StatusOr<L2NormForwardOutputs> L2NormalizationForward(const Context& ctx, const Tensor& x, float eps);

absl::StatusOr<Tensor> L2NormalizationBackward(const Context& ctx, const Tensor& dy, const Tensor& x,
                                               const Tensor& rsigma);

}  // namespace cpu
}  // namespace kernels
}  // namespace teserve

#endif  // TESERVE_KERNELS_CPU_L2_NORM_CPU_H_
