// DotProductAttention: softmax(Q K^T * scale + bias + mask) V per head (TE's
// DotProductAttention), on kernels/attention.h, which states the formulas exactly.
//
// Inputs (query, key, value) in qkv_format layout, H = num_attention_heads,
// G = num_gqa_groups, D_qk = kv_channels, D_v = kv_channels_v:
//   sbhd  [S_q, B, H, D_qk], [S_kv, B, G, D_qk], [S_kv, B, G, D_v]  -> [S_q, B, H * D_v]
//   bshd  [B, S_q, H, D_qk], [B, S_kv, G, D_qk], [B, S_kv, G, D_v]  -> [B, S_q, H * D_v]
//   thd   [T_q, H, D_qk],    [T_kv, G, D_qk],    [T_kv, G, D_v]     -> [T_q, H * D_v]
// With return_max_logit a second output, max_logit FP32 [H], follows (no gradient).
//
// Side inputs (layers/module.h), read only when the configuration needs them:
//   attention_mask   arbitrary: BOOL broadcastable to [B, H, S_q, S_kv], true = masked.
//                    padding types with sbhd/bshd: BOOL [B, 1, 1, S] for self-attention
//                    (S_q == S_kv == S), true marking padding; the real tokens must be
//                    a prefix of each sequence (right padding, as TE's fused backends
//                    assume) and the mask is turned into sequence lengths used for both
//                    queries and keys. Used only when cu_seqlens_q/kv are absent.
//   cu_seqlens_q, cu_seqlens_kv   INT32 [B + 1]: thd (required), or sequence lengths of
//                    padding types with sbhd/bshd (cross-attention needs these).
//   cu_seqlens_q_padded, cu_seqlens_kv_padded   INT32 [B + 1], thd only, optional:
//                    sequence start offsets when tokens sit between sequences.
//   core_attention_bias   FP32 [1|B, 1|H, S_q, S_kv]: pre/post_scale_bias (not thd).
//                    Treated as a constant: no gradient flows to it.
//   alibi_slopes     FP32 [H] or [B, H]: alibi; absent -> TE's default slopes.
// ValidateSide reports problems as INVALID_ARGUMENT naming "side_inputs.<name>".
//
// Parameters: "<name>.softmax_offset" FP32 [H], zeros at start, for softmax_type
// learnable only.
//
// No GEMM quantization inside attention: under any recipe the layer runs in FP32 (TE's
// FP8 attention belongs to the future fused GPU kernels).
//
// Dropout (attention_dropout > 0) applies to forwards that save for backward (training);
// a forward without save_for_backward (inference, no_grad) runs without dropout, as TE's
// module in eval mode. The mask comes from ctx.seed and a stream derived from the
// options' seed and a per-layer counter of dropout forwards, so a session replaying the
// same calls gets the same masks, and each backward regenerates its forward's mask.
//
// checkpoint_core_attention: the forward keeps only q, k, v, the side tensors and the
// dropout seed/stream; the backward recomputes the forward (bit-identical, being
// deterministic), so gradients are bit-exact against the non-checkpointed path.
#ifndef TESERVE_LAYERS_DOT_PRODUCT_ATTENTION_H_
#define TESERVE_LAYERS_DOT_PRODUCT_ATTENTION_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kernels/attention.h"
#include "layers/module.h"

namespace teserve {
namespace layers {

struct AttentionWindow {
  int64_t left = -1;   // -1: unbounded
  int64_t right = -1;  // -1: unbounded
};

// TE's DotProductAttention arguments (names and defaults).
struct DotProductAttentionOptions {
  int64_t num_attention_heads = 0;
  int64_t kv_channels = 0;    // head size of query and key (and value unless kv_channels_v)
  int64_t kv_channels_v = 0;  // head size of value; 0: kv_channels (TE's pair form otherwise)
  int64_t num_gqa_groups = 0;  // 0: num_attention_heads (MHA); 1: MQA
  float attention_dropout = 0.0f;
  kernels::QkvFormat qkv_format = kernels::QkvFormat::kSbhd;
  kernels::AttnMaskType attn_mask_type = kernels::AttnMaskType::kCausal;
  // Unset: (-1, 0) for causal types, (-1, -1) otherwise. Causal types need right == 0;
  // the others (-1, -1) or both >= 0 (TE's check_set_window_size).
  std::optional<AttentionWindow> window_size;
  std::optional<float> softmax_scale;  // unset: 1 / sqrt(kv_channels)
  kernels::SoftmaxType softmax_type = kernels::SoftmaxType::kVanilla;
  kernels::AttnBiasType core_attention_bias_type = kernels::AttnBiasType::kNoBias;
  bool return_max_logit = false;
  bool checkpoint_core_attention = false;
  // The side input holding attention_mask; a MultiheadAttention doing cross-attention
  // may point its inner attention at "enc_dec_attention_mask".
  std::string attention_mask_input = "attention_mask";
  uint64_t seed = 0;  // keys the dropout streams of this layer
  // The dtype q, k, v arrive in (the stack's params_dtype): FLOAT32, or BFLOAT16 /
  // FLOAT16, which the kernels take as they are (cuDNN's fused SDPA where it applies).
  // Used to say which path runs before the first forward.
  DType activation_dtype = DType::kFloat32;
};

// Checks the options; INVALID_ARGUMENT names "<field>.<option>" with TE's argument
// names ("model.layers[0].dot_product_attention.num_gqa_groups: expected a divisor of
// num_attention_heads 8, got 3").
absl::Status ValidateDotProductAttentionOptions(const DotProductAttentionOptions& options, absl::string_view field);

class DotProductAttention : public Module {
 public:
  // Validates the options (field "options") before building.
  static absl::StatusOr<std::unique_ptr<DotProductAttention>> Create(std::string name,
                                                                     const DotProductAttentionOptions& options);

  std::string kind() const override { return "DotProductAttention"; }
  const DotProductAttentionOptions& options() const { return options_; }
  // The kernel configuration the layer runs (window and scale resolved, no dropout).
  const kernels::AttentionConfig& config() const { return config_; }

  absl::StatusOr<std::vector<Shape>> OutputShapes(const std::vector<Shape>& input_shapes,
                                                  absl::string_view field) const override;
  absl::Status ValidateSide(const SideInputs& side, const std::vector<Shape>& input_shapes) const override;
  absl::StatusOr<ForwardOutput> Forward(const Context& ctx, const std::vector<Tensor>& inputs,
                                        const ForwardOptions& options) override;
  absl::StatusOr<std::vector<Tensor>> Backward(const Context& ctx, SavedActivations& saved,
                                               const std::vector<Tensor>& grad_outputs,
                                               SideGrads* side_grads = nullptr) override;
  std::vector<Parameter*> Parameters() override;
  void DescribeAttention(const Device& device, std::vector<AttentionPathInfo>* out) const override;
  std::vector<RngCounter> RngCounters() override { return {{name() + ".dropout_calls", &dropout_calls_}}; }

 private:
  DotProductAttention(std::string name, const DotProductAttentionOptions& options)
      : Module(std::move(name)), options_(options) {}

  // The kernel's side tensors for these inputs (padding masks become cu_seqlens).
  absl::StatusOr<kernels::AttentionSideTensors> GatherSide(const SideInputs* side,
                                                           const std::vector<Shape>& input_shapes) const;

  DotProductAttentionOptions options_;
  kernels::AttentionConfig config_;
  // config_ with the dropout a training forward runs with (the path GetSession predicts).
  kernels::AttentionConfig TrainingConfig() const;

  Parameter softmax_offset_;  // learnable only
  // The path the last forward took and why (empty before the first), for GetSession.
  std::string last_path_;
  std::string last_reason_;
  uint64_t dropout_calls_ = 0;
};

}  // namespace layers
}  // namespace teserve

#endif  // TESERVE_LAYERS_DOT_PRODUCT_ATTENTION_H_
