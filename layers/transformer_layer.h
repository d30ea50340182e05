// TransformerLayer: an attention block and an MLP block with residual connections (TE's
// TransformerLayer), built from MultiheadAttention and LayerNormMLP sub-modules, so every
// GEMM follows the session's recipe exactly as those layers do.
//
// Input hidden_states in attn_input_format layout: sbhd [S, B, hidden], bshd
// [B, S, hidden] or thd [T, hidden]; one output of the same shape.
//
// Forward (x = hidden_states; BDA(h, b, r) = r + DropPath(Dropout(h + b)),
// "bias-dropout-add"; BDA' = r + Dropout(h + b), without drop path, as TE's cross
// attention):
//   a, a_b, a_ln = self_attention(x)      input_layernorm unless output_layernorm
//   r  = a_ln if apply_residual_connection_post_layernorm (and !output_layernorm) else x
//   parallel_attention_mlp:
//     m, m_b = layernorm_mlp(x);  out = x + DropPath(Dropout(a + a_b + m + m_b))
//   otherwise:
//     h = BDA(a, a_b, r)
//     decoder: c, c_b, c_ln = inter_attention(h, encoder_output)   (cross attention)
//              h = BDA'(c, c_b, c_ln if post-LN residual else h)
//     m, m_b, m_ln = layernorm_mlp(h)
//     out = (m_ln if post-LN residual else h) + DropPath(Dropout(m + m_b))
//   output_layernorm: out = layernorm(out)
// Dropout has probability hidden_dropout; DropPath (stochastic depth, drop_path_rate)
// zeroes whole samples of the batch (the B dimension; not with thd) and scales the
// others by 1 / (1 - rate); the self-attention and MLP sites draw independent masks.
// Both run only in forwards that save for backward (training), as TE's module in train
// mode; the masks are counter-based random draws from ctx.seed, the layer's seed and a
// per-layer forward counter, and the backward regenerates them.
//
// params_dtype (TE's): FLOAT32, BFLOAT16 or FLOAT16, the dtype the activations compute
// and travel in. It overrides the sub-modules' own: the self and cross attention
// (layers/multihead_attention.h), the LayerNormMLP (layers/layernorm_mlp.h) and the
// output_layernorm all compute in it. hidden_states is converted to it on entry, so
// the residual stream is kept in params_dtype, as TE's. The glue (the bias-dropout-adds,
// the parallel blocks' sums, the residual gradient adds) runs on FP32 kernels: its
// operands are widened exactly and each result is rounded once to params_dtype, as
// TE's fused bias-dropout-add computes in FP32 and writes BF16; the bias gradients of
// the bias-dropout-adds are FP32 column sums. The dropout and drop path masks depend
// on the seeds and the shape only, so a 16-bit layer draws the FP32 layer's masks bit
// for bit. The output comes out in params_dtype, the gradients travel in it and the
// hidden_states gradient goes back in the dtype hidden_states came in; the
// encoder_output gradient is FP32 (the side input's dtype); parameters and their
// gradients stay FP32 masters.
//
// checkpoint_core_attention (in the attention options) recomputes each attention core
// in the backward; gradients are bit-exact against the stored path.
//
// Between its blocks (self attention, cross attention, MLP), forward and backward, it
// asks the Context's Interruption whether to stop (core/context.h).
//
// Sub-modules and parameter names: "<name>.self_attention.*", "<name>.inter_attention.*"
// (decoder), "<name>.layernorm_mlp.*" (layers/multihead_attention.h and
// layers/layernorm_mlp.h list them), "<name>.layernorm.weight" / ".bias" with
// output_layernorm. Quantizers are reported under the same sub-layer names.
//
// Side inputs: those of MultiheadAttention (attention_mask for the self attention,
// encoder_output and enc_dec_attention_mask for the decoder's cross attention,
// cu_seqlens_* for thd, core_attention_bias, alibi_slopes); the gradient of
// encoder_output goes to SideGrads.encoder_output.
#ifndef TESERVE_LAYERS_TRANSFORMER_LAYER_H_
#define TESERVE_LAYERS_TRANSFORMER_LAYER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "layers/layernorm_mlp.h"
#include "layers/module.h"
#include "layers/multihead_attention.h"
#include "layers/normalization.h"
#include "recipes/recipe.h"

namespace teserve {
namespace layers {

enum class TransformerLayerType { kEncoder, kDecoder };

struct TransformerLayerOptions {
  // The self-attention block (attention_type self; input_layernorm, return_bias and
  // return_layernorm_output are set by the layer).
  MultiheadAttentionOptions self_attention;
  // Decoder only: the cross-attention block (attention_type cross).
  std::optional<MultiheadAttentionOptions> inter_attention;
  // The MLP block (return_bias and return_layernorm_output are set by the layer).
  LayerNormMLPOptions mlp;
  float hidden_dropout = 0.1f;
  float drop_path_rate = 0.0f;
  bool apply_residual_connection_post_layernorm = false;
  bool output_layernorm = false;
  bool parallel_attention_mlp = false;
  uint64_t seed = 0;
  // TE's params_dtype (see above): FLOAT32, BFLOAT16 or FLOAT16; the sub-modules'
  // params_dtype is set from it.
  DType params_dtype = DType::kFloat32;
};

// Checks what the sub-module options do not: dropout rates in [0, 1), params_dtype
// FLOAT32, BFLOAT16 or FLOAT16, no drop path with thd, the blocks agree on hidden_size
// and format, parallel_attention_mlp only for encoders without post-layernorm residuals. INVALID_ARGUMENT names "<field>.<option>".
absl::Status ValidateTransformerLayerOptions(const TransformerLayerOptions& options, absl::string_view field);

class TransformerLayer : public Module {
 public:
  static absl::StatusOr<std::unique_ptr<TransformerLayer>> Create(std::string name,
                                                                  const TransformerLayerOptions& options,
                                                                  const recipes::Recipe& recipe);

  std::string kind() const override { return "TransformerLayer"; }
  // As given to Create (the sub-module flags the layer sets are not reflected here).
  const TransformerLayerOptions& options() const { return options_; }
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
  std::vector<RngCounter> RngCounters() override;

 private:
  struct Saved;

  TransformerLayer(std::string name, const TransformerLayerOptions& options)
      : Module(std::move(name)), options_(options) {}

  bool post_ln_attention() const {
    return options_.apply_residual_connection_post_layernorm && !options_.output_layernorm;
  }
  bool has_bias() const { return options_.mlp.bias; }

  TransformerLayerOptions options_;
  std::unique_ptr<MultiheadAttention> self_attention_;
  std::unique_ptr<MultiheadAttention> inter_attention_;  // decoder only
  std::unique_ptr<LayerNormMLP> layernorm_mlp_;
  std::unique_ptr<Normalization> layernorm_;  // output_layernorm only
  uint64_t dropout_calls_ = 0;                // training forwards so far (mask streams)
};

}  // namespace layers
}  // namespace teserve

#endif  // TESERVE_LAYERS_TRANSFORMER_LAYER_H_
