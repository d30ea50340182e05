#include "layers/transformer_layer_spec.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "core/status.h"
#include "layers/layernorm_spec.h"
#include "layers/multihead_attention_spec.h"
#include "layers/spec_checks.h"

namespace teserve {
namespace layers {
namespace {

// The same status with sub-spec field names replaced by the TransformerLayer's own.
absl::Status Renamed(const absl::Status& status, absl::string_view field,
                     std::initializer_list<std::pair<absl::string_view, absl::string_view>> names) {
  if (status.ok()) return status;
  std::string message(status.message());
  for (const auto& [from, to] : names) {
    message = absl::StrReplaceAll(message, {{absl::StrCat(field, ".", from, ":"), absl::StrCat(field, ".", to, ":")}});
  }
  return absl::Status(status.code(), message);
}

// The attention block as a MultiheadAttentionSpec; `cross` selects the decoder's
// cross attention (its own mask type and window).
v1::MultiheadAttentionSpec AttentionSpec(const v1::TransformerLayerSpec& s, bool cross) {
  v1::MultiheadAttentionSpec a;
  a.set_hidden_size(s.hidden_size());
  a.set_num_attention_heads(s.num_attention_heads());
  if (s.has_kv_channels()) a.set_kv_channels(s.kv_channels());
  if (s.has_num_gqa_groups()) a.set_num_gqa_groups(s.num_gqa_groups());
  if (s.has_attention_dropout()) a.set_attention_dropout(s.attention_dropout());
  if (s.has_layernorm_epsilon()) a.set_layernorm_epsilon(s.layernorm_epsilon());
  if (cross) {
    a.set_attention_type("cross");
    a.set_attn_mask_type(s.enc_dec_attn_mask_type().empty() ? "no_mask" : s.enc_dec_attn_mask_type());
    if (s.has_enc_dec_window_size()) *a.mutable_window_size() = s.enc_dec_window_size();
  } else {
    a.set_attn_mask_type(s.self_attn_mask_type());
    if (s.has_window_size()) *a.mutable_window_size() = s.window_size();
  }
  a.set_input_layernorm(true);
  a.set_normalization(s.normalization());
  a.set_zero_centered_gamma(s.zero_centered_gamma());
  if (s.has_bias()) a.set_bias(s.bias());
  a.set_fuse_qkv_params(s.fuse_qkv_params());
  if (s.has_qkv_weight_interleaved()) a.set_qkv_weight_interleaved(s.qkv_weight_interleaved());
  a.set_qkv_format(s.attn_input_format());
  a.set_qk_norm_type(s.qk_norm_type());
  if (s.has_qk_norm_eps()) a.set_qk_norm_eps(s.qk_norm_eps());
  a.set_qk_norm_before_rope(s.qk_norm_before_rope());
  if (s.has_rotary()) *a.mutable_rotary() = s.rotary();
  a.set_rotary_pos_interleaved(s.rotary_pos_interleaved());
  a.set_softmax_type(s.softmax_type());
  if (s.has_init_std()) a.set_init_std(s.init_std());
  if (s.has_output_layer_init_std()) a.set_output_layer_init_std(s.output_layer_init_std());
  a.set_checkpoint_core_attention(s.checkpoint_core_attention());
  return a;
}

v1::LayerNormMLPSpec MlpSpec(const v1::TransformerLayerSpec& s) {
  v1::LayerNormMLPSpec m;
  m.set_hidden_size(s.hidden_size());
  m.set_ffn_hidden_size(s.ffn_hidden_size());
  if (s.has_layernorm_epsilon()) m.set_eps(s.layernorm_epsilon());
  if (s.has_bias()) m.set_bias(s.bias());
  m.set_normalization(s.normalization());
  m.set_activation(s.activation());
  if (s.has_activation_params()) *m.mutable_activation_params() = s.activation_params();
  m.set_zero_centered_gamma(s.zero_centered_gamma());
  if (s.has_init_std()) m.set_init_std(s.init_std());
  return m;
}

}  // namespace

absl::StatusOr<TransformerLayerOptions> TransformerLayerOptionsFromSpec(const v1::TransformerLayerSpec& s,
                                                                        const recipes::Recipe& recipe,
                                                                        absl::string_view field) {
  TransformerLayerOptions o;
  const std::string f(field);
  if (!s.layer_type().empty() && s.layer_type() != "encoder" && s.layer_type() != "decoder") {
    return InvalidField(absl::StrCat(f, ".layer_type"), "\"encoder\" or \"decoder\"",
                        absl::StrCat("\"", s.layer_type(), "\""));
  }
  const bool decoder = s.layer_type() == "decoder";

  absl::StatusOr<MultiheadAttentionOptions> self_attention =
      MultiheadAttentionOptionsFromSpec(AttentionSpec(s, /*cross=*/false), recipe, f);
  RETURN_IF_ERROR(Renamed(self_attention.status(), f,
                          {{"attn_mask_type", "self_attn_mask_type"}, {"qkv_format", "attn_input_format"}}));
  o.self_attention = *std::move(self_attention);
  if (decoder) {
    absl::StatusOr<MultiheadAttentionOptions> inter =
        MultiheadAttentionOptionsFromSpec(AttentionSpec(s, /*cross=*/true), recipe, f);
    RETURN_IF_ERROR(Renamed(inter.status(), f,
                            {{"attn_mask_type", "enc_dec_attn_mask_type"},
                             {"window_size", "enc_dec_window_size"},
                             {"qkv_format", "attn_input_format"}}));
    o.inter_attention = *std::move(inter);
  }

  absl::StatusOr<LayerNormMLPOptions> mlp = LayerNormMLPOptionsFromSpec(MlpSpec(s), recipe, f);
  RETURN_IF_ERROR(Renamed(mlp.status(), f, {{"eps", "layernorm_epsilon"}}));
  o.mlp = *std::move(mlp);
  // FC2 follows TE's output_layer_init_method, FC1 its init_method.
  if (s.has_output_layer_init_std() && s.output_layer_init_std() != o.mlp.init_std) {
    // LayerNormMLP has one init_std; TE's two methods collapse to init_std for both
    // GEMMs unless they differ, which this release does not support for the MLP.
    return InvalidField(absl::StrCat(f, ".output_layer_init_std"),
                        absl::StrCat("init_std (", o.mlp.init_std,
                                     "): the MLP initializes FC1 and FC2 alike in this release"),
                        s.output_layer_init_std());
  }

  if (s.has_hidden_dropout()) o.hidden_dropout = s.hidden_dropout();
  if (s.has_drop_path_rate()) o.drop_path_rate = s.drop_path_rate();
  o.apply_residual_connection_post_layernorm = s.apply_residual_connection_post_layernorm();
  o.output_layernorm = s.output_layernorm();
  o.parallel_attention_mlp = s.parallel_attention_mlp();
  RETURN_IF_ERROR(ValidateTransformerLayerOptions(o, f));
  return o;
}

int64_t ParameterCount(const TransformerLayerOptions& options) {
  MultiheadAttentionOptions sa = options.self_attention;
  sa.input_layernorm = !options.output_layernorm;
  int64_t count = ParameterCount(sa) + ParameterCount(options.mlp);
  if (options.inter_attention.has_value()) {
    MultiheadAttentionOptions ca = *options.inter_attention;
    ca.input_layernorm = true;
    count += ParameterCount(ca);
  }
  if (options.output_layernorm) {
    count += NormParameterCount(options.mlp.normalization, options.mlp.hidden_size);
  }
  return count;
}

}  // namespace layers
}  // namespace teserve
