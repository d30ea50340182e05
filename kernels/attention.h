// Scaled dot-product attention, forward and backward (TE's DotProductAttention core).
//
// Layouts (qkv_format). B batch, S_q / S_kv sequence lengths, T_q / T_kv token counts,
// H query heads, G key/value heads (GQA groups), D_qk head size of q and k, D_v of v:
//   sbhd  q [S_q, B, H, D_qk]  k [S_kv, B, G, D_qk]  v [S_kv, B, G, D_v]
//   bshd  q [B, S_q, H, D_qk]  k [B, S_kv, G, D_qk]  v [B, S_kv, G, D_v]
//   thd   q [T_q, H, D_qk]     k [T_kv, G, D_qk]     v [T_kv, G, D_v]
// out has q's layout with D_v; softmax_lse has q's layout without the head size
// ([S_q, B, H], [B, S_q, H], [T_q, H]). H % G == 0; query head h reads key/value head
// h / (H / G) (consecutive query heads share a group; G = 1 is MQA).
//
// Sequences. For sbhd/bshd, sequence b is the b-th batch entry with lengths s_q = S_q,
// s_kv = S_kv, except under the padding mask types, where cu_seqlens_q/kv (INT32
// [B + 1], cu[0] = 0, non-decreasing) give s_q(b) = cu_q[b + 1] - cu_q[b] <= S_q and
// likewise s_kv(b) <= S_kv: positions 0..s(b)-1 are real tokens, the rest padding
// (right padding). For thd, sequence b occupies rows off(b) .. off(b) + s(b) - 1 of the
// t dimension, with s(b) from cu_seqlens and off(b) = cu_seqlens_padded[b] when given,
// else cu_seqlens[b]; sequences must not overlap (s(b) <= off(b + 1) - off(b)) and must
// end by T. thd requires a padding mask type. Within a sequence, i is the query
// position and j the key position (0-based).
//
// Scores of sequence b, head h (FP64 internally):
//   qk(i, j) = sum_d q[i, h, d] * k[j, g(h), d]
//   no_bias, alibi:   S = scale * qk + A          (A = 0 for no_bias)
//   pre_scale_bias:   S = scale * (qk + bias[b, h, i, j])
//   post_scale_bias:  S = scale * qk + bias[b, h, i, j]
// bias is FP32 [1|B, 1|H, S_q, S_kv] (size-1 dims broadcast); not accepted with thd.
// ALiBi: A(i, j) = -slope * |i + o - j| with slopes FP32 [H] or [B, H] and the diagonal
// offset o defined below.
//
// Mask: (i, j) takes part in the softmax iff all of
//   padding types (and thd): i < s_q(b) and j < s_kv(b)
//   arbitrary:               mask[b, h, i, j] is false (BOOL [1|B, 1|H, 1|S_q, 1|S_kv],
//                            size-1 dims broadcast; true = masked out, as in TE)
//   window (left, right):    left  == -1 or j >= i + o - left,
//                            right == -1 or j <= i + o + right.
// Causal mask types are windows with right = 0 (window_right must be 0 for them).
// The diagonal offset o: 0 for causal and padding_causal (top-left alignment);
// s_kv(b) - s_q(b) for every other type (bottom-right alignment, TE's default), with
// the actual lengths of padding types and thd.
//
// Softmax over j of the unmasked scores of one row, with an optional sink logit c that
// takes part in the normalization but attends to no value (TE's softmax_type):
//   vanilla      no sink
//   off-by-one   c = 0
//   learnable    c = softmax_offset[h] (FP32 [H], a learnable parameter)
//   lse = log(exp(c) + sum_j exp(S(i, j))),  P(i, j) = exp(S(i, j) - lse)
// A row with no unmasked score (a padding query, an empty window, a fully masked
// arbitrary row) and no sink has lse = -inf, P = 0 and output 0; tokens of a thd
// tensor outside every sequence are treated the same way. Their gradients are 0.
//
// Dropout with probability p in [0, 1) (applied after the softmax, as in TE):
//   P'(i, j) = P(i, j) * keep(h, r_q, r_kv) / (1 - p),
//   keep = Uniform24ToFloat(RandomBits24(RandomKey(dropout_seed, dropout_stream,
//          kDropoutCopyId), (h * R_q + r_q) * R_kv + r_kv)) >= p
// (kernels/stochastic_rounding.h), where r_q / r_kv are the token rows of query i and
// key j in the tensors' token dimensions (sbhd: i * B + b; bshd: b * S + i; thd: the t
// row) and R_q / R_kv their counts (S * B or T). keep is a pure function of
// (seed, stream, position), so the backward regenerates the mask without storing it;
// p = 0 draws nothing.
//
//   out(i, h) = sum_j P'(i, j) * v[j, g(h)]
//   max_logit[h] = max of S(i, j) over every sequence, query and unmasked key of head h
//                  (before the sink and dropout; -inf when nothing is unmasked).
//
// Backward, given the forward's out and softmax_lse and the gradient dout:
//   dP'(i, j) = dout(i) . v(j)          dP = dP' * keep / (1 - p)
//   delta(i)  = dout(i) . out(i)        (= sum_j P dP, sink included)
//   dS(i, j)  = P(i, j) * (dP(i, j) - delta(i))
//   dq(i)  = scale * sum_j dS k(j)      dk(j) = scale * sum_{i, h in g} dS q(i)
//   dv(j)  = sum_{i, h in g} P' dout(i)
//   dsoftmax_offset[h] = -sum_{b, i} exp(c - lse(i)) * delta(i)     (learnable)
//   dbias = sum over broadcast dims of dS (post_scale_bias) or scale * dS
//           (pre_scale_bias), shaped like bias.
// max_logit has no gradient.
//
// Precision. q, k, v (and out, dout, dq, dk, dv) are FP32, BF16 or FP16, all of one
// dtype; softmax_lse, max_logit and the side tensors are FP32. The CPU implementation
// (kernels/cpu/attention_cpu.h) computes scores, softmax and every sum in FP64 and rounds
// once; it is the unfused reference and the oracle for the CUDA paths. 16-bit inputs
// that the fused path does not take are widened to FP32, run through the FP32 path, and
// the outputs rounded back to the input dtype.
//
// CUDA contexts run one of two paths (AttentionForwardOutputs.path says which ran):
//   - cuDNN's fused SDPA (kernels/cuda/attention/cudnn_attention.h) for BF16 / FP16
//     sbhd / bshd / thd inputs with any mask type but arbitrary (padding types included), any
//     window, GQA / MQA, the vanilla softmax and no dropout or max_logit; with no bias,
//     a post_scale_bias (sbhd / bshd), or ALiBi with the default slopes under causal /
//     padding_causal (top-left: cuDNN's ALiBi is slope * (j - i) on the causal side);
//     when cuDNN is present and accepts the shapes, and when every query row of every
//     sequence has a key to attend (checked on the host from the lengths; a row without
//     one sends the call unfused). Its results agree with the reference within the
//     16-bit rounding of its inputs and outputs (its internal sums are FP32); a
//     post_scale_bias is rounded to q's dtype on the way in (cuDNN's bias is in the
//     inputs' dtype) and dbias comes back from that dtype. A backward whose dbias shape
//     cuDNN refuses runs unfused from the fused forward's out and softmax_lse.
//   - the unfused kernels of kernels/cuda/attention for everything else: scores
//     recomputed row by row, never materialized, FP32 arithmetic throughout, so results
//     agree with the CPU's within FP32 rounding of the sums involved; dropout masks are
//     the same bits. Every output element is written by one warp summing in a fixed order
//     (no atomics), so results are deterministic. Device cu_seqlens are copied to the
//     host for the value checks (the only host synchronization). Head sizes D_qk and D_v
//     above 256 are UNIMPLEMENTED there.
// Both are deterministic (cuDNN's backward runs its deterministic algorithm). Results do
// not depend on thread count or call order. No FP8 attention here.
#ifndef TESERVE_KERNELS_ATTENTION_H_
#define TESERVE_KERNELS_ATTENTION_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/context.h"
#include "core/tensor.h"

namespace teserve {
namespace kernels {

enum class QkvFormat { kSbhd, kBshd, kThd };

enum class AttnMaskType {
  kNoMask,
  kPadding,
  kCausal,
  kPaddingCausal,
  kCausalBottomRight,
  kPaddingCausalBottomRight,
  kArbitrary,
};

enum class SoftmaxType { kVanilla, kOffByOne, kLearnable };

enum class AttnBiasType { kNoBias, kPreScaleBias, kPostScaleBias, kAlibi };

// The `copy` argument of RandomKey for dropout masks (0 and 1 are the quantization copies).
inline constexpr uint32_t kDropoutCopyId = 2;

// TE's spellings: "sbhd"; "no_mask", "padding_causal", ...; "vanilla", "off-by-one",
// "learnable"; "no_bias", "pre_scale_bias", "post_scale_bias", "alibi".
absl::string_view QkvFormatName(QkvFormat format);
absl::string_view AttnMaskTypeName(AttnMaskType type);
absl::string_view SoftmaxTypeName(SoftmaxType type);
absl::string_view AttnBiasTypeName(AttnBiasType type);

// Parse TE's spellings (mask types also accept "padding,causal" and "causal,padding"
// for padding_causal, as TE does). INVALID_ARGUMENT naming `field` and listing the
// accepted values otherwise.
absl::StatusOr<QkvFormat> ParseQkvFormat(absl::string_view text, absl::string_view field);
absl::StatusOr<AttnMaskType> ParseAttnMaskType(absl::string_view text, absl::string_view field);
absl::StatusOr<SoftmaxType> ParseSoftmaxType(absl::string_view text, absl::string_view field);
absl::StatusOr<AttnBiasType> ParseAttnBiasType(absl::string_view text, absl::string_view field);

bool HasPadding(AttnMaskType type);      // padding, padding_causal, padding_causal_bottom_right
bool IsCausal(AttnMaskType type);        // the four causal types
bool IsTopLeftAligned(AttnMaskType type);  // causal, padding_causal

// TE's default ALiBi slopes for `heads` heads (the geometric sequence of the ALiBi
// paper): with n = 2^floor(log2(heads)), slope k (1-based, k <= n) = 2^(-8k / n), and
// the remaining heads - n slopes are 2^(-4(2m - 1) / n), m = 1, 2, ...
std::vector<float> DefaultAlibiSlopes(int64_t heads);

struct AttentionConfig {
  QkvFormat qkv_format = QkvFormat::kSbhd;
  AttnMaskType mask_type = AttnMaskType::kNoMask;
  int64_t window_left = -1;   // -1: unbounded; else >= 0
  int64_t window_right = -1;  // -1: unbounded; else >= 0; 0 for causal types
  float softmax_scale = 1.0f;  // finite > 0
  SoftmaxType softmax_type = SoftmaxType::kVanilla;
  AttnBiasType bias_type = AttnBiasType::kNoBias;
  float dropout = 0.0f;  // in [0, 1)
  uint64_t dropout_seed = 0;
  uint64_t dropout_stream = 0;
  bool return_max_logit = false;
  // alibi: the slopes are DefaultAlibiSlopes(H) (the caller passed none). cuDNN's fused
  // ALiBi computes exactly those slopes itself, so only then may it run there.
  bool alibi_default_slopes = false;
  // false lets cuDNN's fused backward use its non-deterministic algorithm (dq summed with
  // atomics: faster, results vary in the last bits between runs). The unfused kernels and
  // the CPU reference are deterministic either way.
  bool deterministic = true;
};

// The optional tensors of one call; leave undefined what the config does not read.
struct AttentionSideTensors {
  Tensor cu_seqlens_q;          // INT32 [B + 1]: padding types, thd
  Tensor cu_seqlens_kv;         // INT32 [B + 1]: padding types, thd
  Tensor cu_seqlens_q_padded;   // INT32 [B + 1]: thd, optional
  Tensor cu_seqlens_kv_padded;  // INT32 [B + 1]: thd, optional
  Tensor mask;                  // BOOL: arbitrary
  Tensor bias;                  // FP32: pre_scale_bias, post_scale_bias
  Tensor alibi_slopes;          // FP32 [H] or [B, H]: alibi
  Tensor softmax_offset;        // FP32 [H]: learnable
};

// Which implementation ran a forward.
enum class AttentionPath { kCpuReference, kCudnnFused, kCudaUnfused };

struct AttentionForwardOutputs {
  Tensor out;          // q's layout with D_v, q's dtype
  Tensor softmax_lse;  // FP32, q's layout without the head size; saved for the backward
  Tensor max_logit;    // FP32 [H], with return_max_logit
  AttentionPath path = AttentionPath::kCpuReference;
  std::string unfused_reason;  // 16-bit inputs that did not run fused: why
};

struct AttentionBackwardOutputs {
  Tensor dq;               // q's shape
  Tensor dk;               // k's shape
  Tensor dv;               // v's shape
  Tensor dsoftmax_offset;  // [H], learnable only
  Tensor dbias;            // bias's shape, pre/post_scale_bias only
  AttentionPath path = AttentionPath::kCpuReference;  // which implementation ran
  std::string unfused_reason;  // 16-bit inputs that did not run fused: why
};

// The names error messages give the side tensors (a layer passes its side-input names).
struct AttentionSideNames {
  std::string cu_seqlens_q = "cu_seqlens_q";  // "<name>_padded" for the padded offsets
  std::string cu_seqlens_kv = "cu_seqlens_kv";
  std::string mask = "mask";
  std::string bias = "bias";
  std::string alibi_slopes = "alibi_slopes";
  std::string softmax_offset = "softmax_offset";
};

// The checks AttentionForward runs on the configuration and the side tensors, for
// q/k/v of the given shapes (q/k/v shape errors name "q.shape", "k.shape", "v.shape").
absl::Status CheckAttentionCall(const Context& ctx, const AttentionConfig& config, const Shape& q, const Shape& k,
                                const Shape& v, const AttentionSideTensors& side,
                                const AttentionSideNames& names = AttentionSideNames());

// Process-wide switch (the server's --allow_nondeterministic_attention): when set, every
// fused backward runs cuDNN's non-deterministic algorithm whatever config.deterministic
// says. Off by default, so a restarted run reproduces its losses bit for bit.
void AllowNondeterministicAttention(bool allow);
bool NondeterministicAttentionAllowed();

// OK when a call with this configuration, dtype and head sizes on `device` is in the
// fused path's set and cuDNN is present (cuDNN's verdict on the shapes comes with the
// call); else UNIMPLEMENTED whose message says why ("not fused: ...").
absl::Status FusedAttentionEligible(const Device& device, const AttentionConfig& config, DType dtype, int64_t d_qk,
                                    int64_t d_v);

// Validates every shape, dtype, device, option and cu_seqlens value (INVALID_ARGUMENT
// naming the argument: "k.shape", "cu_seqlens_q", "config.window_right", ...), then runs.
absl::StatusOr<AttentionForwardOutputs> AttentionForward(const Context& ctx, const AttentionConfig& config,
                                                         const Tensor& q, const Tensor& k, const Tensor& v,
                                                         const AttentionSideTensors& side);

// `out` and `softmax_lse` are the forward's outputs for the same inputs and config;
// dout has out's shape.
absl::StatusOr<AttentionBackwardOutputs> AttentionBackward(const Context& ctx, const AttentionConfig& config,
                                                           const Tensor& q, const Tensor& k, const Tensor& v,
                                                           const AttentionSideTensors& side, const Tensor& out,
                                                           const Tensor& softmax_lse, const Tensor& dout);

}  // namespace kernels
}  // namespace teserve

#endif  // TESERVE_KERNELS_ATTENTION_H_
