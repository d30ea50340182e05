#include "layers/multihead_attention_spec.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "layers/spec_checks.h"

namespace teserve {
namespace layers {

absl::StatusOr<MultiheadAttentionOptions> MultiheadAttentionOptionsFromSpec(const v1::MultiheadAttentionSpec& s,
                                                                            const recipes::Recipe& recipe,
                                                                            absl::string_view field) {
  auto name = [&](absl::string_view option) { return absl::StrCat(field, ".", option); };
  MultiheadAttentionOptions o;
  RETURN_IF_ERROR(CheckSize(s.hidden_size(), name("hidden_size")));
  RETURN_IF_ERROR(CheckSize(s.num_attention_heads(), name("num_attention_heads")));
  o.hidden_size = s.hidden_size();
  o.num_attention_heads = s.num_attention_heads();
  if (s.has_kv_channels()) {
    RETURN_IF_ERROR(CheckSize(s.kv_channels(), name("kv_channels")));
    o.kv_channels = s.kv_channels();
  }
  if (s.has_num_gqa_groups()) {
    RETURN_IF_ERROR(CheckSize(s.num_gqa_groups(), name("num_gqa_groups")));
    o.num_gqa_groups = s.num_gqa_groups();
  }
  if (s.has_attention_dropout()) o.attention_dropout = s.attention_dropout();
  if (s.has_layernorm_epsilon()) {
    RETURN_IF_ERROR(CheckPositiveFinite(s.layernorm_epsilon(), name("layernorm_epsilon")));
    o.layernorm_epsilon = s.layernorm_epsilon();
  }
  if (!s.attn_mask_type().empty()) {
    ASSIGN_OR_RETURN(o.attn_mask_type, kernels::ParseAttnMaskType(s.attn_mask_type(), name("attn_mask_type")));
  }
  if (s.has_window_size()) o.window_size = AttentionWindow{s.window_size().left(), s.window_size().right()};
  if (!s.attention_type().empty()) {
    ASSIGN_OR_RETURN(o.attention_type, ParseAttentionType(s.attention_type(), name("attention_type")));
  }
  o.input_layernorm = s.input_layernorm();
  ASSIGN_OR_RETURN(o.normalization, ParseNormalization(s.normalization(), name("normalization")));
  o.zero_centered_gamma = s.zero_centered_gamma();
  o.bias = s.has_bias() ? s.bias() : true;
  o.return_bias = s.return_bias();
  o.return_layernorm_output = s.return_layernorm_output();
  o.fuse_qkv_params = s.fuse_qkv_params();
  if (s.has_qkv_weight_interleaved()) o.qkv_weight_interleaved = s.qkv_weight_interleaved();
  if (!s.qkv_format().empty()) {
    ASSIGN_OR_RETURN(o.qkv_format, kernels::ParseQkvFormat(s.qkv_format(), name("qkv_format")));
  }
  ASSIGN_OR_RETURN(o.qk_norm_type, ParseQkNormType(s.qk_norm_type(), name("qk_norm_type")));
  if (s.has_qk_norm_eps()) {
    RETURN_IF_ERROR(CheckPositiveFinite(s.qk_norm_eps(), name("qk_norm_eps")));
    o.qk_norm_eps = s.qk_norm_eps();
  }
  o.qk_norm_before_rope = s.qk_norm_before_rope();
  if (s.has_rotary()) {
    const v1::RotarySpec& r = s.rotary();
    RotaryEmbeddingOptions rotary;
    if (r.has_rotary_percent()) rotary.rotary_percent = r.rotary_percent();
    if (r.has_rotary_base()) rotary.rotary_base = r.rotary_base();
    if (r.has_seq_len_interpolation_factor()) rotary.seq_len_interpolation_factor = r.seq_len_interpolation_factor();
    if (r.has_pretrained_max_position_embeddings()) {
      rotary.pretrained_max_position_embeddings = r.pretrained_max_position_embeddings();
    }
    o.rotary = rotary;
  }
  o.rotary_pos_interleaved = s.rotary_pos_interleaved();
  if (!s.softmax_type().empty()) {
    ASSIGN_OR_RETURN(o.softmax_type, kernels::ParseSoftmaxType(s.softmax_type(), name("softmax_type")));
  }
  RETURN_IF_ERROR(CheckInitStd(s.has_init_std(), s.init_std(), name("init_std")));
  if (s.has_init_std()) o.init_std = s.init_std();
  RETURN_IF_ERROR(
      CheckInitStd(s.has_output_layer_init_std(), s.output_layer_init_std(), name("output_layer_init_std")));
  if (s.has_output_layer_init_std()) o.output_layer_init_std = s.output_layer_init_std();
  o.checkpoint_core_attention = s.checkpoint_core_attention();

  RETURN_IF_ERROR(ValidateMultiheadAttentionOptions(o, field));
  // The projection widths: bounded like every other size, and tiled by the recipe's blocks.
  const int64_t d = HeadDim(o);
  const int64_t groups = o.num_gqa_groups > 0 ? o.num_gqa_groups : o.num_attention_heads;
  const std::string kv_text = s.has_kv_channels() ? "kv_channels" : "the head size";
  if (o.num_attention_heads * d > kMaxDim) {  // both factors <= 2^24: no overflow
    return InvalidField(name("num_attention_heads"),
                        absl::StrCat("num_attention_heads * ", kv_text, " in 1..", kMaxDim), o.num_attention_heads * d);
  }
  RETURN_IF_ERROR(CheckTiles(o.hidden_size, recipe, name("hidden_size")));
  RETURN_IF_ERROR(CheckTiles(o.num_attention_heads * d, recipe, name("num_attention_heads"),
                             absl::StrCat("num_attention_heads * ", kv_text, " (the query width) ")));
  RETURN_IF_ERROR(CheckTiles(groups * d, recipe,
                             name(s.has_num_gqa_groups() ? "num_gqa_groups" : "num_attention_heads"),
                             absl::StrCat("num_gqa_groups * ", kv_text, " (the key/value width) ")));
  return o;
}

int64_t ParameterCount(const MultiheadAttentionOptions& o) {
  const int64_t d = HeadDim(o);
  const int64_t groups = o.num_gqa_groups > 0 ? o.num_gqa_groups : o.num_attention_heads;
  const int64_t hq = o.num_attention_heads * d;
  const int64_t projected = hq + 2 * groups * d;  // query, key and value rows
  int64_t count = o.hidden_size * projected + (o.bias ? projected : 0);
  if (o.input_layernorm) count += NormParameterCount(o.normalization, o.hidden_size);
  if (o.qk_norm_type == QkNormType::kRmsNorm) count += 2 * NormParameterCount(NormKind::kRmsNorm, d);
  if (o.qk_norm_type == QkNormType::kLayerNorm) count += 2 * NormParameterCount(NormKind::kLayerNorm, d);
  if (o.softmax_type == kernels::SoftmaxType::kLearnable) count += o.num_attention_heads;
  count += hq * o.hidden_size + (o.bias ? o.hidden_size : 0);  // proj
  return count;
}

}  // namespace layers
}  // namespace teserve
