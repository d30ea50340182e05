// Rotary position embedding (RoPE), forward and backward, and the frequency table it
// reads (TE's RotaryPositionEmbedding and apply_rotary_pos_emb).
//
// Frequencies (RotaryFrequencies): with rotary dim r = dim, or floor(dim * rotary_percent)
// when rotary_percent < 1 (r must be even), inv_freq[i] = 1 / rotary_base^(2i / r) for
// i < r/2, and for position p = (s + offset) * interpolation (see RotaryOptions):
//   not interleaved: freqs[s] = [p*inv_freq[0..r/2), p*inv_freq[0..r/2)]  (two halves)
//   interleaved:     freqs[s] = [p*inv_freq[0], p*inv_freq[0], p*inv_freq[1], ...]
// freqs is FP32 [max_seq_len, r] (TE's [s, 1, 1, r] without the unit dimensions),
// computed in FP32 as TE does.
//
// Rotation (RopeForward), per token and head over the first r = freqs.dim(1) channels
// of t; channels r..d pass through unchanged:
//   out[j] = t[j] * cos(f[j]) + sign(j) * t[partner(j)] * sin(f[j]),  f = freqs[pos]
//   not interleaved: partner(j) = j + r/2 with sign -1 for j < r/2; j - r/2 with +1 after
//   interleaved:     partner(j) = j + 1 with sign -1 for even j; j - 1 with +1 for odd j
// (t * cos + rotate_half(t) * sin). `interleaved` must match the layout of freqs.
// RopeBackward applies the transpose: dt[j] = dy[j] cos(f[j]) - sign(j) dy[p] sin(f[p]),
// p = partner(j); for freqs built by RotaryFrequencies that is the inverse rotation.
//
// Layouts of t (FP32) and the position pos of a token:
//   kSbhd [s, b, h, d]: pos = s index;  kBshd [b, s, h, d]: pos = s index
//   kThd  [t, h, d] with cu_seqlens INT32 [batch + 1] (0 = c[0] <= c[1] <= ... <= t):
//         token i of sequence k (c[k] <= i < c[k+1]) has pos = i - c[k], so positions
//         restart at every sequence; tokens at or past c[batch] (padding) pass through.
// freqs needs a row for every position used (max_seq_len >= s, or >= the longest
// sequence for thd). cos and sin are evaluated in double (CPU and CUDA); outputs are FP32.
// t/dy and freqs live on ctx's device; cu_seqlens is a host tensor also for CUDA contexts.
#ifndef TESERVE_KERNELS_ROPE_H_
#define TESERVE_KERNELS_ROPE_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/context.h"
#include "core/tensor.h"

namespace teserve {
namespace kernels {

enum class RopeFormat { kSbhd, kBshd, kThd };

// "sbhd", "bshd", "thd" (TE's qkv_format names); INVALID_ARGUMENT naming `field` else.
absl::StatusOr<RopeFormat> ParseRopeFormat(absl::string_view name, absl::string_view field);
absl::string_view RopeFormatName(RopeFormat format);

// TE's RotaryPositionEmbedding arguments.
struct RotaryOptions {
  int64_t dim = 0;              // head dimension the embedding is built for
  double rotary_percent = 1.0;  // in (0, 1]: r = floor(dim * rotary_percent), in double as TE
  float rotary_base = 10000.0f;
  bool interleaved = false;
  // Position interpolation: with a factor and pretrained_max_position_embeddings > 0,
  // positions are divided by the factor (fixed linear scaling), or by
  // max_seq_len / pretrained_max_position_embeddings when max_seq_len exceeds
  // pretrained * factor (dynamic scaling). 0 = off, as TE's None.
  double seq_len_interpolation_factor = 0.0;
  int64_t pretrained_max_position_embeddings = 0;
};

// The rotary dimension r of `options`, or INVALID_ARGUMENT naming `field` (with
// ".dim", ".rotary_percent", ".rotary_base" suffixes) when r is 0 or odd, or an
// argument is out of range.
absl::StatusOr<int64_t> RotaryDim(const RotaryOptions& options, absl::string_view field);

// freqs FP32 [max_seq_len, r] for positions offset .. offset + max_seq_len - 1.
absl::StatusOr<Tensor> RotaryFrequencies(const RotaryOptions& options, int64_t max_seq_len, int64_t offset = 0);

// out has t's shape. cu_seqlens is read only for kThd (required there, may be null else).
absl::StatusOr<Tensor> RopeForward(const Context& ctx, const Tensor& t, const Tensor& freqs, RopeFormat format,
                                   bool interleaved, const Tensor* cu_seqlens);

// dt has dy's shape; same arguments as the forward.
absl::StatusOr<Tensor> RopeBackward(const Context& ctx, const Tensor& dy, const Tensor& freqs, RopeFormat format,
                                    bool interleaved, const Tensor* cu_seqlens);

}  // namespace kernels
}  // namespace teserve

#endif  // TESERVE_KERNELS_ROPE_H_
