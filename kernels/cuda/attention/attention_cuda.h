// CUDA backend of kernels/attention.h: unfused scaled dot-product attention, forward and
// backward, in FP32 (kernels in attention_kernels.h). The dispatcher (kernels/attention.cc)
// has checked the configuration, every tensor (FP32 / INT32 / BOOL on ctx's CUDA device)
// and the cu_seqlens values. Outputs and scratch come from the stream-ordered pool on
// ctx.stream, every kernel runs there, and nothing synchronizes with the host. Results
// are deterministic (no atomics; fixed summation orders) and agree with the FP64 CPU
// reference within FP32 rounding.
//
// Head sizes D_qk and D_v above kMaxAttentionHeadDim (256) are UNIMPLEMENTED (the
// kernels hold a head-size row in registers, 8 elements per lane).
#ifndef TESERVE_KERNELS_CUDA_ATTENTION_ATTENTION_CUDA_H_
#define TESERVE_KERNELS_CUDA_ATTENTION_ATTENTION_CUDA_H_

#include "absl/status/statusor.h"
#include "core/context.h"
#include "core/tensor.h"
#include "kernels/attention.h"

namespace teserve {
namespace kernels {
namespace cuda {

absl::StatusOr<AttentionForwardOutputs> AttentionForward(const Context& ctx, const AttentionConfig& config,
                                                         const Tensor& q, const Tensor& k, const Tensor& v,
                                                         const AttentionSideTensors& side);

absl::StatusOr<AttentionBackwardOutputs> AttentionBackward(const Context& ctx, const AttentionConfig& config,
                                                           const Tensor& q, const Tensor& k, const Tensor& v,
                                                           const AttentionSideTensors& side, const Tensor& out,
                                                           const Tensor& softmax_lse, const Tensor& dout);

}  // namespace cuda
}  // namespace kernels
}  // namespace teserve

#endif  // TESERVE_KERNELS_CUDA_ATTENTION_ATTENTION_CUDA_H_
