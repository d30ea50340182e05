// Launchers of the unfused CUDA attention kernels (attention_forward_kernels.cu,
// attention_backward_kernels.cu); contract kernels/attention.h, host side
// attention_cuda.cc. Light header (CUDA runtime only); the launchers do not synchronize
// and return cudaGetLastError after the launch.
//
// Work split. Every kernel gives one warp one row of work and loops over the other side
// of the score matrix, recomputing the scores it needs; a lane holds the head-size
// elements lane, lane + 32, ... of its rows in registers (at most kMaxAttentionHeadDim
// elements, so 8 per lane), and every dot product ends in an xor-butterfly warp sum,
// whose result is bit-identical in all lanes (a + b == b + a), so the lanes take the same
// branches on it. All math is FP32. No kernel uses atomics: each output element is
// written by exactly one warp, whose summation order is fixed, so results do not depend
// on scheduling.
//   forward:  a warp per (query token row, head): online softmax over the row's keys
//             (running max and sum, the output accumulator rescaled when the max grows),
//             then out, softmax_lse and the row's largest logit (for max_logit).
//   backward: a warp per (query row, head) computes delta = dout . out (and the sink's
//             gradient term); a warp per (query row, head) accumulates dq over keys; a
//             warp per (key row, key/value head) accumulates dk and dv over the queries of
//             every head of its group; a warp per dbias element sums dS over the
//             broadcast batch and head dimensions. P is recomputed from softmax_lse.
//   per-head reductions (max_logit, dsoftmax_offset): a block per head over the rows in
//             a fixed order.
// Rows are located in their sequences from the device cu_seqlens, so no sequence
// metadata is read on the host.
#ifndef TESERVE_KERNELS_CUDA_ATTENTION_ATTENTION_KERNELS_H_
#define TESERVE_KERNELS_CUDA_ATTENTION_ATTENTION_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace teserve {
namespace kernels {
namespace cuda {

// The largest D_qk and D_v the kernels hold in registers.
inline constexpr int64_t kMaxAttentionHeadDim = 256;

// Values match the order of kernels::QkvFormat / AttnBiasType / SoftmaxType, but are
// spelled here so the .cu files need no abseil header.
enum class AttnLayout : int { kSbhd = 0, kBshd = 1, kThd = 2 };
enum class AttnBias : int { kNone = 0, kPreScale = 1, kPostScale = 2, kAlibi = 3 };
enum class AttnSink : int { kNone = 0, kZero = 1, kLearnable = 2 };

struct AttentionLaunchParams {
  AttnLayout layout = AttnLayout::kSbhd;
  int64_t batch = 0;  // sequences (thd: cu_seqlens entries - 1)
  int64_t heads = 0;
  int64_t groups = 0;
  int64_t d_qk = 0;
  int64_t d_v = 0;
  int64_t full_q = 0;  // S_q, S_kv (sbhd/bshd)
  int64_t full_kv = 0;
  int64_t rows_q = 0;  // token rows: S * B or T
  int64_t rows_kv = 0;
  // Device INT32 [batch + 1]. cu_*: sequence lengths (null: every sequence is full_*
  // long); off_*: thd's first rows (cu_seqlens_*_padded, or cu_* itself).
  const int32_t* cu_q = nullptr;
  const int32_t* cu_kv = nullptr;
  const int32_t* off_q = nullptr;
  const int32_t* off_kv = nullptr;

  bool top_left = false;     // diagonal offset 0 (causal, padding_causal), else s_kv - s_q
  int64_t window_left = -1;  // -1 unbounded
  int64_t window_right = -1;
  const uint8_t* mask = nullptr;  // arbitrary: BOOL broadcast to [B, H, S_q, S_kv], true = masked
  int64_t mask_dims[4] = {1, 1, 1, 1};

  float scale = 1.0f;
  AttnBias bias_type = AttnBias::kNone;
  const float* bias = nullptr;  // [1|B, 1|H, S_q, S_kv]
  int64_t bias_dims[4] = {1, 1, 1, 1};
  const float* alibi_slopes = nullptr;  // [H] or [B, H]
  bool alibi_per_batch = false;

  AttnSink sink = AttnSink::kNone;
  const float* softmax_offset = nullptr;  // [H], kLearnable

  float dropout = 0.0f;        // p; 0 draws nothing
  float dropout_scale = 1.0f;  // 1 / (1 - p)
  uint64_t dropout_key = 0;    // RandomKey(seed, stream, kDropoutCopyId)
};

// out [rows_q, H, D_v], lse [rows_q, H] (every element written: rows outside every
// sequence get 0 and -inf); row_max [rows_q, H] (optional) receives each row's largest
// unmasked logit (-inf when none).
cudaError_t LaunchAttentionForward(const AttentionLaunchParams& p, const float* q, const float* k, const float* v,
                                   float* out, float* lse, float* row_max, cudaStream_t stream);

// out[h] = max (kMax) or sum (kSum, accumulated in FP64) of x[r * heads + h] over r, in
// a fixed order; -inf / 0 for no rows.
enum class HeadReduce : int { kMax = 0, kSum = 1 };
cudaError_t LaunchReducePerHead(HeadReduce op, const float* x, int64_t rows, int64_t heads, float* out,
                                cudaStream_t stream);

// delta [rows_q, H] = dout . out for rows with a finite lse inside a sequence, else 0;
// sink_terms [rows_q, H] (kLearnable only, else may be null) = -exp(c - lse) * delta.
cudaError_t LaunchAttentionBackwardPrepare(const AttentionLaunchParams& p, const float* out, const float* dout,
                                           const float* lse, float* delta, float* sink_terms, cudaStream_t stream);

// dq [rows_q, H, D_qk]; every element written.
cudaError_t LaunchAttentionBackwardDq(const AttentionLaunchParams& p, const float* q, const float* k, const float* v,
                                      const float* dout, const float* lse, const float* delta, float* dq,
                                      cudaStream_t stream);

// dk [rows_kv, G, D_qk], dv [rows_kv, G, D_v]; every element written.
cudaError_t LaunchAttentionBackwardDkDv(const AttentionLaunchParams& p, const float* q, const float* k,
                                        const float* v, const float* dout, const float* lse, const float* delta,
                                        float* dk, float* dv, cudaStream_t stream);

// dbias with p.bias_dims (sbhd/bshd only); every element written.
cudaError_t LaunchAttentionBackwardDbias(const AttentionLaunchParams& p, const float* q, const float* k,
                                         const float* v, const float* dout, const float* lse, const float* delta,
                                         float* dbias, cudaStream_t stream);

// softmax_lse in a layout given by strides (q's layout without the head size) <->
// cuDNN's packed [B, H, S_q] statistics (cudnn_attention.cc).
// thd: row_start (INT32 [B + 1] on the device, the token row where each sequence starts)
// replaces stride_b, so position s of sequence b is at (row_start[b] + s) * stride_s.
struct LseLayout {
  int64_t batch = 0;
  int64_t heads = 0;
  int64_t seq = 0;
  int64_t stride_b = 0;  // elements, in the strided layout
  int64_t stride_h = 0;
  int64_t stride_s = 0;
  const int32_t* row_start = nullptr;
};

// to_layout: packed [B, H, S] `in` -> strided `out`; else strided `in` -> packed `out`.
// seq_len (INT32 [B] on the device, or null): rows s >= seq_len[b] are padding; they
// get -inf in the layout (to_layout: the contract's lse of a row with nothing to attend;
// with row_start they are not written, as they belong to no token of sequence b) and 0
// in the packed statistics (the fused backward reads no padded row; a finite value keeps
// a stray read finite).
cudaError_t LaunchLsePermute(const LseLayout& layout, const float* in, float* out, bool to_layout,
                             const int32_t* seq_len, cudaStream_t stream);

// seq_len[b] = cu_seqlens[b + 1] - cu_seqlens[b] for b < batch (INT32, on the device).
cudaError_t LaunchSeqLensFromCu(const int32_t* cu_seqlens, int32_t* seq_len, int64_t batch, cudaStream_t stream);

// Token rows of an sbhd / bshd tensor of 16-bit elements: row (b, s) starts at element
// b * stride_b + s * stride_s and holds row_elems contiguous elements (H * D).
struct TokenRows {
  int64_t batch = 0;
  int64_t seq = 0;
  int64_t stride_b = 0;
  int64_t stride_s = 0;
  int64_t row_elems = 0;
};

// Zeroes the rows (b, s) with s >= seq_len[b] (padding tokens: their outputs and
// gradients are 0 by the contract, whatever a fused kernel left there).
cudaError_t LaunchZeroPaddedRows(const TokenRows& rows, const int32_t* seq_len, uint16_t* data, cudaStream_t stream);

// thd: offsets[b] = row_start[b] * row_elems for b <= batch (cuDNN's ragged offsets, in
// elements; the caller keeps them within INT32).
cudaError_t LaunchRaggedOffsets(const int32_t* row_start, int32_t* offsets, int64_t batch, int64_t row_elems,
                                cudaStream_t stream);

// thd: the token rows t < tokens that belong to no sequence (no b with row_start[b] <= t
// < row_start[b] + seq_len[b]) get zeros in data (row_elems 16-bit elements per row) and,
// when lse is given, -inf in lse[t * heads .. + heads).
struct RaggedRows {
  int64_t tokens = 0;
  int64_t batch = 0;
  int64_t row_elems = 0;
  int64_t heads = 0;
};
cudaError_t LaunchClearRowsOutsideSequences(const RaggedRows& rows, const int32_t* row_start, const int32_t* seq_len,
                                            uint16_t* data, float* lse, cudaStream_t stream);

}  // namespace cuda
}  // namespace kernels
}  // namespace teserve

#endif  // TESERVE_KERNELS_CUDA_ATTENTION_ATTENTION_KERNELS_H_
