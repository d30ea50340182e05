// CPU reference for kernels/attention.h: the unfused attention (explicit scores, mask,
// softmax, dropout, weighted sum), forward and backward, FP64 inside.
//
// Assumes the checks of kernels/attention.cc have passed (dtypes, shapes, devices,
// options, cu_seqlens values); call the kernels:: entry points for checked use. One row
// of scores (one query of one head) is live at a time, so memory is O(S_kv), not
// O(S_q * S_kv); the backward recomputes the scores from q and k.
#ifndef TESERVE_KERNELS_CPU_ATTENTION_CPU_H_
#define TESERVE_KERNELS_CPU_ATTENTION_CPU_H_

#include "absl/status/statusor.h"
#include "core/context.h"
#include "core/tensor.h"
#include "kernels/attention.h"

namespace teserve {
namespace kernels {
namespace cpu {

absl::StatusOr<AttentionForwardOutputs> AttentionForward(const Context& ctx, const AttentionConfig& config,
                                                         const Tensor& q, const Tensor& k, const Tensor& v,
                                                         const AttentionSideTensors& side);

absl::StatusOr<AttentionBackwardOutputs> AttentionBackward(const Context& ctx, const AttentionConfig& config,
                                                           const Tensor& q, const Tensor& k, const Tensor& v,
                                                           const AttentionSideTensors& side, const Tensor& out,
                                                           const Tensor& softmax_lse, const Tensor& dout);

}  // namespace cpu
}  // namespace kernels
}  // namespace teserve

#endif  // TESERVE_KERNELS_CPU_ATTENTION_CPU_H_
