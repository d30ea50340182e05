// CUDA implementations of kernels/normalization.h (LayerNorm / RMSNorm forward with the
// fused per-tensor FP8 output, and backward).
//
// Every function requires its tensors to live on one CUDA device (the dispatcher in
// kernels/normalization.cc calls them only then) and runs on ctx.stream (nullptr = the
// default stream). Outputs are allocated through the CUDA allocator registered with core;
// the forward's amax is copied to the host, which synchronizes the stream when a
// quantized output is requested. Launch errors and a bad sm_margin come back as Status.
#ifndef TESERVE_KERNELS_CUDA_NORMALIZATION_CUDA_H_
#define TESERVE_KERNELS_CUDA_NORMALIZATION_CUDA_H_

#include "absl/status/statusor.h"
#include "core/context.h"
#include "core/tensor.h"
#include "kernels/normalization.h"

namespace teserve {
namespace kernels {
namespace cuda {

absl::StatusOr<NormForwardResult> NormalizationForward(const Context& ctx, NormType type,
                                                       const Tensor& x, const Tensor& gamma,
                                                       const Tensor& beta,
                                                       const NormForwardOptions& options);

absl::StatusOr<NormBackwardOutputs> NormalizationBackward(const Context& ctx, NormType type,
                                                          const Tensor& dy, const Tensor& x,
                                                          const Tensor& mu, const Tensor& rsigma,
                                                          const Tensor& gamma,
                                                          const NormBackwardOptions& options);

}  // namespace cuda
}  // namespace kernels
}  // namespace teserve

#endif  // TESERVE_KERNELS_CUDA_NORMALIZATION_CUDA_H_
