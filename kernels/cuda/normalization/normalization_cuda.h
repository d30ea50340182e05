// CUDA implementations of kernels/normalization.h (LayerNorm / RMSNorm forward with the
// fused per-tensor FP8 or MXFP8 output, and backward).
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

// Whether NormalizationForward computes options.mxfp8 in its one fused kernel for these
// inputs (the register-tile kernel: BF16 / FP16 x, cols % 64 == 0 up to 8192, rows % 8
// == 0, rows % 32 == 0 with the columnwise copy, 16-byte aligned x, gamma, beta, and a
// cluster that fits the SMs left by sm_margin). When false, NormalizationForward must not
// be asked for options.mxfp8 (the caller composes the norm and QuantizeMxfp8). Errors: a
// bad sm_margin or a CUDA failure.
absl::StatusOr<bool> FusesMxfp8(NormType type, const Tensor& x, const Tensor& gamma,
                                const Tensor& beta, const NormForwardOptions& options);

absl::StatusOr<NormBackwardOutputs> NormalizationBackward(const Context& ctx, NormType type,
                                                          const Tensor& dy, const Tensor& x,
                                                          const Tensor& mu, const Tensor& rsigma,
                                                          const Tensor& gamma,
                                                          const NormBackwardOptions& options);

}  // namespace cuda
}  // namespace kernels
}  // namespace teserve

#endif  // TESERVE_KERNELS_CUDA_NORMALIZATION_CUDA_H_
