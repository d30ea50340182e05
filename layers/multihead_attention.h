// MultiheadAttention: QKV projection, optional qk normalization and rotary position
// embedding, scaled dot-product attention and the output projection (TE's
// MultiheadAttention). H = num_attention_heads, G = num_gqa_groups, D = kv_channels,
// hq = H * D, hkv = G * D.
//
// Input hidden_states: sbhd [S, B, hidden], bshd [B, S, hidden] or thd [T, hidden]
// (qkv_format). Outputs, in TE's order:
//   out  hidden_states' shape         always
//   bias [hidden]                     with return_bias and bias (the proj bias, not added)
//   ln   hidden_states' shape         with input_layernorm and return_layernorm_output
//                                     (return_layernorm_output alone is ignored, as in TE)
//
// Forward:
//   x' = input_layernorm ? Norm(x) : x                 (LayerNorm or RMSNorm, layernorm_epsilon)
//   self:  q, k, v = projections of x'
//   cross: q = projection of x'; k, v = projections of the side input encoder_output
//          (same layout, last dim hidden; its gradient goes to SideGrads.encoder_output)
//   q [.., H, D], k and v [.., G, D];
//   qk_norm_before_rope: q, k = qk_norm(q), qk_norm(k);  rope;  otherwise rope, then qk_norm
//   context = DotProductAttention(q, k, v) [.., hq];  out = proj(context)
// qk_norm_type, over each head's D channels (qk_norm_eps): L2Normalization (no
// parameters, kernels/l2_norm.h), RMSNorm or LayerNorm (separate q_norm / k_norm
// weights of size D, as TE).
//
// Rotary position embedding (our wire form of TE's rotary_pos_emb argument): the
// layer builds the frequency table itself from RotaryEmbeddingOptions with TE's
// RotaryPositionEmbedding(dim = kv_channels, rotary_percent, rotary_base, ...) and
// applies it to q and k (kernels/rope.h) with rotary_pos_interleaved. Positions are
// the s index for sbhd/bshd (both q and k start at 0, as TE with one table); for thd
// they restart at each sequence of cu_seqlens_q(_padded) for q and
// cu_seqlens_kv(_padded) for k (the padded form when given, as TE's pad_between_seqs).
//
// Projections, as TE's sub-modules (each GEMM is a Linear, or the Linear inside a
// LayerNormLinear, so every recipe applies to it):
//   self:  "<name>.qkv" (Linear) or, with input_layernorm, "<name>.layernorm_qkv"
//          (LayerNormLinear), hidden -> hq + 2 hkv, one GEMM. Row layout of the weight
//          with fuse_qkv_params and qkv_weight_interleaved (TE's default):
//          [G][H/G query heads, key head, value head][D]; otherwise [q heads | k | v].
//   cross: "<name>.query_layer" (Linear) or "<name>.layernorm_query" (LayerNormLinear),
//          hidden -> hq, on hidden_states; "<name>.key_value" (Linear), hidden -> 2 hkv,
//          on encoder_output, rows [G][key head, value head][D] when interleaved,
//          otherwise [k heads | v heads].
//   output: "<name>.proj" (Linear), hq -> hidden, with return_bias.
// Quantizers are reported under these sub-layer names.
// Parameters (TE's names): with fuse_qkv_params "<sub>.weight" and "<sub>.bias";
// without, the fused weight is exposed as row blocks (views of the one weight, so the
// GEMM stays one GEMM, as TE's parameters_split): "<name>.qkv.query_weight",
// ".key_weight", ".value_weight" (and "_bias"), "<name>.layernorm_qkv.query_weight", ...,
// "<name>.layernorm_query.query_weight", "<name>.key_value.key_weight",
// "<name>.key_value.value_weight" ("<name>.query_layer.weight" is never split, as TE).
// input_layernorm: "<name>.layernorm_qkv.layer_norm_weight" (and "_bias" for LayerNorm),
// or the layernorm_query equivalents. proj: "<name>.proj.weight", "<name>.proj.bias".
// RMSNorm/LayerNorm qk norm: "<name>.q_norm.weight", "<name>.k_norm.weight" (and
// ".bias"), each of size D. softmax_type learnable: "<name>.core_attention.softmax_offset".
//
// params_dtype (TE's): the dtype the activations compute and travel in, FLOAT32,
// BFLOAT16 or FLOAT16. Every sub-layer runs in it (the projections and proj as 16-bit
// Linears, the input layernorm and the q_norm / k_norm writing it, the core attention
// taking 16-bit q, k, v: cuDNN's fused SDPA on a GPU where it applies); the head split
// and merge copy in it. RoPE and L2Normalization are FP32 kernels: they read the
// widened 16-bit values and their results are rounded once back to params_dtype
// (forward and backward), as TE's FP32-internal kernels writing 16-bit outputs. Outputs
// come out in params_dtype, the gradient of hidden_states in the dtype it came in, the
// encoder_output gradient in FP32 (the side input's dtype); parameters and their
// gradients stay FP32 masters.
//
// Side inputs: those of DotProductAttention (layers/dot_product_attention.h); for
// cross-attention its mask is read from "enc_dec_attention_mask"; encoder_output for
// cross-attention; cu_seqlens_* for thd.
#ifndef TESERVE_LAYERS_MULTIHEAD_ATTENTION_H_
#define TESERVE_LAYERS_MULTIHEAD_ATTENTION_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kernels/attention.h"
#include "kernels/rope.h"
#include "layers/dot_product_attention.h"
#include "layers/layernorm_linear.h"
#include "layers/linear.h"
#include "layers/module.h"
#include "layers/normalization.h"
#include "recipes/recipe.h"

namespace teserve {
namespace layers {

enum class AttentionType { kSelf, kCross };
enum class QkNormType { kNone, kL2Normalization, kRmsNorm, kLayerNorm };

// "self", "cross"; "" or "none" (TE's None), "L2Normalization", "RMSNorm", "LayerNorm".
absl::StatusOr<AttentionType> ParseAttentionType(absl::string_view text, absl::string_view field);
absl::StatusOr<QkNormType> ParseQkNormType(absl::string_view text, absl::string_view field);

// TE's RotaryPositionEmbedding arguments (dim is kv_channels); interleaving is the
// layer's rotary_pos_interleaved.
struct RotaryEmbeddingOptions {
  double rotary_percent = 1.0;
  float rotary_base = 10000.0f;
  double seq_len_interpolation_factor = 0.0;  // 0: off (TE's None)
  int64_t pretrained_max_position_embeddings = 0;
};

// TE's MultiheadAttention arguments (names and defaults).
struct MultiheadAttentionOptions {
  int64_t hidden_size = 0;
  int64_t num_attention_heads = 0;
  int64_t kv_channels = 0;     // 0: hidden_size / num_attention_heads
  int64_t num_gqa_groups = 0;  // 0: num_attention_heads
  float attention_dropout = 0.1f;
  float layernorm_epsilon = 1e-5f;
  kernels::AttnMaskType attn_mask_type = kernels::AttnMaskType::kCausal;
  std::optional<AttentionWindow> window_size;
  AttentionType attention_type = AttentionType::kSelf;
  bool input_layernorm = false;
  NormKind normalization = NormKind::kLayerNorm;
  bool zero_centered_gamma = false;
  bool bias = true;
  bool return_bias = false;
  bool return_layernorm_output = false;
  bool fuse_qkv_params = false;
  bool qkv_weight_interleaved = true;  // read only with fuse_qkv_params (TE forces false otherwise)
  kernels::QkvFormat qkv_format = kernels::QkvFormat::kSbhd;
  QkNormType qk_norm_type = QkNormType::kNone;
  float qk_norm_eps = 1e-6f;
  bool qk_norm_before_rope = false;
  std::optional<RotaryEmbeddingOptions> rotary;  // unset: no rotary embedding
  bool rotary_pos_interleaved = false;
  kernels::SoftmaxType softmax_type = kernels::SoftmaxType::kVanilla;
  float init_std = 0.023f;               // QKV weights ~ N(0, init_std^2) (TE's init_method)
  float output_layer_init_std = 0.023f;  // proj weight (TE's output_layer_init_method)
  // Recompute the core attention in the backward (DotProductAttention's option; the
  // gradients are bit-exact against the stored path).
  bool checkpoint_core_attention = false;
  uint64_t seed = 0;
  // TE's params_dtype (see above): FLOAT32, BFLOAT16 or FLOAT16.
  DType params_dtype = DType::kFloat32;
};

// Head size D after defaults.
int64_t HeadDim(const MultiheadAttentionOptions& options);

// Checks the options; INVALID_ARGUMENT names "<field>.<option>" with TE's argument
// names ("<field>.num_attention_heads: expected a divisor of hidden_size 96 ...").
absl::Status ValidateMultiheadAttentionOptions(const MultiheadAttentionOptions& options, absl::string_view field);

class MultiheadAttention : public Module {
 public:
  // Validates the options (field "options") before building.
  static absl::StatusOr<std::unique_ptr<MultiheadAttention>> Create(std::string name,
                                                                    const MultiheadAttentionOptions& options,
                                                                    const recipes::Recipe& recipe);

  std::string kind() const override { return "MultiheadAttention"; }
  const MultiheadAttentionOptions& options() const { return options_; }

  absl::StatusOr<std::vector<Shape>> OutputShapes(const std::vector<Shape>& input_shapes,
                                                  absl::string_view field) const override;
  absl::Status ValidateSide(const SideInputs& side, const std::vector<Shape>& input_shapes) const override;
  absl::StatusOr<ForwardOutput> Forward(const Context& ctx, const std::vector<Tensor>& inputs,
                                        const ForwardOptions& options) override;
  absl::StatusOr<std::vector<Tensor>> Backward(const Context& ctx, SavedActivations& saved,
                                               const std::vector<Tensor>& grad_outputs,
                                               SideGrads* side_grads = nullptr) override;
  std::vector<Parameter*> Parameters() override;
  std::vector<NamedQuantizer> Quantizers() override;
  void DescribeAttention(const Device& device, std::vector<AttentionPathInfo>* out) const override;
  std::vector<RngCounter> RngCounters() override { return core_attention_->RngCounters(); }

 private:
  struct Saved;
  struct QkvTensors;

  MultiheadAttention(std::string name, const MultiheadAttentionOptions& options)
      : Module(std::move(name)), options_(options) {}

  bool returns_layernorm_output() const { return options_.input_layernorm && options_.return_layernorm_output; }
  bool cross() const { return options_.attention_type == AttentionType::kCross; }
  // [.., heads, D] shape for a [.., hidden] input shape.
  Shape HeadShape(const Shape& input_shape, int64_t heads) const;
  // The shape of the encoder_output side input, checked against hidden_states.
  absl::StatusOr<Shape> EncoderShape(const SideInputs* side, const Shape& input_shape) const;

  absl::StatusOr<QkvTensors> Project(const Context& ctx, const Tensor& x, const Tensor* encoder_output, bool save,
                                     Saved* saved);
  // dlayernorm_output: the gradient of the returned layernorm output, or null.
  absl::StatusOr<Tensor> ProjectBackward(const Context& ctx, Saved& saved, const Tensor& dq, const Tensor& dk,
                                         const Tensor& dv, const Tensor* dlayernorm_output, SideGrads* side_grads);
  absl::Status NormalizeQk(const Context& ctx, bool save, Saved* saved, Tensor* q, Tensor* k);
  absl::Status NormalizeQkBackward(const Context& ctx, Saved& saved, Tensor* dq, Tensor* dk);
  absl::Status Rotate(const Context& ctx, const SideInputs* side, bool save, Saved* saved, Tensor* q, Tensor* k);

  MultiheadAttentionOptions options_;
  int64_t heads_ = 0, groups_ = 0, head_dim_ = 0;
  int64_t rotary_dim_ = 0;  // 0 without rotary embedding
  kernels::RopeFormat rope_format_ = kernels::RopeFormat::kSbhd;

  // Self: the qkv projection; cross: the query projection. A Linear or a LayerNormLinear.
  std::unique_ptr<Module> query_proj_;
  std::unique_ptr<Linear> key_value_;  // cross only
  // Row views exposing unfused weights of a plain Linear projection (parameters_split).
  std::vector<Parameter> query_split_, key_value_split_;
  std::unique_ptr<Normalization> q_norm_, k_norm_;  // RMSNorm / LayerNorm qk norm
  std::unique_ptr<DotProductAttention> core_attention_;
  std::unique_ptr<Linear> proj_;
};

}  // namespace layers
}  // namespace teserve

#endif  // TESERVE_LAYERS_MULTIHEAD_ATTENTION_H_
