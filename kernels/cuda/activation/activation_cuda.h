// CUDA implementations of kernels/activation.h's fused entry points (forward with the
// per-tensor FP8 output, backward with dbias).
//
// Every function requires its tensors to live on one CUDA device (the dispatcher in
// kernels/activation.cc calls them only then) and runs on ctx.stream (nullptr = the
// default stream). Outputs are allocated through the CUDA allocator registered with core;
// the forward's amax is copied to the host, which synchronizes the stream when a
// quantized output is requested. Launch errors come back as Status.
#ifndef TESERVE_KERNELS_CUDA_ACTIVATION_CUDA_H_
#define TESERVE_KERNELS_CUDA_ACTIVATION_CUDA_H_

#include "absl/status/statusor.h"
#include "core/context.h"
#include "core/tensor.h"
#include "kernels/activation.h"

namespace teserve {
namespace kernels {
namespace cuda {

absl::StatusOr<ActivationForwardResult> FusedActivationForward(const Context& ctx, Activation kind,
                                                               const ActivationParams& params,
                                                               const Tensor& x,
                                                               const ActivationForwardOptions& options);

absl::StatusOr<ActivationBackwardResult> FusedActivationBackward(const Context& ctx, Activation kind,
                                                                 const ActivationParams& params,
                                                                 const Tensor& dy, const Tensor& x,
                                                                 const ActivationBackwardOptions& options);

}  // namespace cuda
}  // namespace kernels
}  // namespace teserve

#endif  // TESERVE_KERNELS_CUDA_ACTIVATION_CUDA_H_
