// Fused scaled dot-product attention through cuDNN's SDPA graphs (the cuDNN frontend),
// forward and backward, for BF16 / FP16 q, k, v on a CUDA device. Contract
// kernels/attention.h; the dispatcher (kernels/attention.cc) has checked the call and
// chooses between this path and the unfused kernels of attention_cuda.h.
//
// What runs fused (everything else answers UNIMPLEMENTED with the reason, and the
// dispatcher runs the unfused path):
//   - sbhd and bshd layouts, given to cuDNN as strides of [B, H, S, D] views (no copies);
//     thd as cuDNN's ragged layout: [B, H, S_max, D] views whose sequences start at
//     ragged offsets (INT32 [B + 1], elements: the sequence's first token row, from
//     cu_seqlens*_padded when given, times H * D), S_max the longest sequence rounded up
//     to a power of two (at least 128; graphs are cached per bucket, not per token count);
//     rows outside every sequence get out 0, lse -inf and zero gradients afterwards;
//   - every mask type but arbitrary, with any window (cuDNN's diagonal band: left bound
//     window_left + 1, right bound window_right, aligned top-left for causal and
//     padding_causal and bottom-right otherwise, as kernels/attention.h defines the
//     offset o); the padding types through cuDNN's per-sequence lengths (INT32 [B],
//     computed on the device from cu_seqlens), with which cuDNN aligns bottom-right on
//     each sequence's actual lengths. Padding rows of out, dq, dk and dv are zeroed and
//     their softmax_lse set to -inf afterwards (the contract's values), whatever cuDNN
//     left there. The dispatcher sends here only calls in which every query row of a
//     sequence has a key to attend (cuDNN's result for a row with none is not the
//     contract's);
//   - GQA / MQA (K and V with fewer heads), D_qk == D_v;
//   - no bias; a post_scale_bias (side.bias, [1|B, 1|H, S_q, S_kv], in q's dtype: the
//     dispatcher rounds the contract's FP32 bias), with dbias from cuDNN's backward in
//     that dtype (cuDNN sums the broadcast dimensions); ALiBi through cuDNN's own
//     (slope_h * (j - i), the default slopes) when the caller's slopes are the defaults
//     and the mask is causal or padding_causal, where that is the contract's
//     -slope_h * |i - j|. pre_scale_bias and given slopes run unfused;
//   - the vanilla softmax, no dropout, no max_logit. Dropout needs our counter-based masks
//     bit for bit, which cuDNN's generator does not produce.
//
// cuDNN is loaded at run time (dlopen of libcudnn.so.9): a host without it runs the
// unfused path, and the binaries link no cuDNN library. Each problem's graph (shapes,
// strides, dtype, mask, scale) is built once and cached; a cuDNN handle is kept per
// (device, stream). softmax_lse is FP32 in q's layout without the head size, as the
// contract says: cuDNN's [B, H, S_q] statistics (natural-log logsumexp of the scaled
// scores) are permuted into it after the forward and back before the backward.
// The backward runs cuDNN's deterministic algorithm unless config.deterministic is false
// (then dq is summed with atomics: faster, not repeatable bit for bit).
#ifndef TESERVE_KERNELS_CUDA_ATTENTION_CUDNN_ATTENTION_H_
#define TESERVE_KERNELS_CUDA_ATTENTION_CUDNN_ATTENTION_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/context.h"
#include "core/tensor.h"
#include "kernels/attention.h"

namespace teserve {
namespace kernels {
namespace cuda {

// OK when the configuration and dtype are in the fused set above (not yet whether cuDNN
// is present or accepts the shapes); else UNIMPLEMENTED saying why.
absl::Status FusedAttentionEligible(const AttentionConfig& config, DType dtype, int64_t d_qk, int64_t d_v);

// The cuDNN runtime's version (e.g. 91900), or UNIMPLEMENTED when it cannot be loaded.
absl::StatusOr<int64_t> CudnnRuntimeVersion();

// What the dispatcher read on the host of a thd call's sequences: the longest query and
// key sequence (cuDNN's S_max before bucketing). Unused by the other layouts.
struct FusedSequences {
  int64_t longest_q = 0;
  int64_t longest_kv = 0;
};

// side: the cu_seqlens (and thd's padded offsets) of the padding types and thd, checked
// by the dispatcher; nothing else is read.
absl::StatusOr<AttentionForwardOutputs> FusedAttentionForward(const Context& ctx, const AttentionConfig& config,
                                                              const Tensor& q, const Tensor& k, const Tensor& v,
                                                              const AttentionSideTensors& side,
                                                              const FusedSequences& sequences);

absl::StatusOr<AttentionBackwardOutputs> FusedAttentionBackward(const Context& ctx, const AttentionConfig& config,
                                                                const Tensor& q, const Tensor& k, const Tensor& v,
                                                                const AttentionSideTensors& side,
                                                                const FusedSequences& sequences, const Tensor& out,
                                                                const Tensor& softmax_lse, const Tensor& dout);

// Destroys the cuDNN handle bound to (device, stream), if any (the stream is going away).
void ReleaseCudnnHandle(int device_index, void* stream);

}  // namespace cuda
}  // namespace kernels
}  // namespace teserve

#endif  // TESERVE_KERNELS_CUDA_ATTENTION_CUDNN_ATTENTION_H_
