// CPU reference for kernels/activation.h: every activation kind, forward and backward.
//
// Assumes the metadata checks of kernels/activation.cc have passed (FP32 rank-2 CPU
// tensors, even width for gated kinds, dy shaped like the output, valid params); call
// the kernels:: entry points for checked use.
#ifndef TESERVE_KERNELS_CPU_ACTIVATION_CPU_H_
#define TESERVE_KERNELS_CPU_ACTIVATION_CPU_H_

#include "absl/status/statusor.h"
#include "core/context.h"
#include "core/tensor.h"
#include "kernels/activation.h"

namespace teserve {
namespace kernels {
namespace cpu {

absl::StatusOr<Tensor> ActivationForward(const Context& ctx, Activation kind, const ActivationParams& params,
                                         const Tensor& x);

absl::StatusOr<Tensor> ActivationBackward(const Context& ctx, Activation kind, const ActivationParams& params,
                                          const Tensor& dy, const Tensor& x);

// Reference of the fused entry points: x (and dy) widened to FP32, the FP32 op above,
// then QuantizePerTensor / CastFromFloat32 of the FP32 y; dbias sums the FP32 dx in FP64.
absl::StatusOr<ActivationForwardResult> FusedActivationForward(const Context& ctx, Activation kind,
                                                               const ActivationParams& params,
                                                               const Tensor& x,
                                                               const ActivationForwardOptions& options);

absl::StatusOr<ActivationBackwardResult> FusedActivationBackward(const Context& ctx, Activation kind,
                                                                 const ActivationParams& params,
                                                                 const Tensor& dy, const Tensor& x,
                                                                 const ActivationBackwardOptions& options);

}  // namespace cpu
}  // namespace kernels
}  // namespace teserve

#endif  // TESERVE_KERNELS_CPU_ACTIVATION_CPU_H_
