#include "layers/dot_product_attention_spec.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "layers/spec_checks.h"

namespace teserve {
namespace layers {

absl::StatusOr<DotProductAttentionOptions> DotProductAttentionOptionsFromSpec(const v1::DotProductAttentionSpec& s,
                                                                              absl::string_view field) {
  auto name = [&](absl::string_view option) { return absl::StrCat(field, ".", option); };
  DotProductAttentionOptions o;
  RETURN_IF_ERROR(CheckSize(s.num_attention_heads(), name("num_attention_heads")));
  RETURN_IF_ERROR(CheckSize(s.kv_channels(), name("kv_channels")));
  o.num_attention_heads = s.num_attention_heads();
  o.kv_channels = s.kv_channels();
  if (s.has_kv_channels_v()) {
    RETURN_IF_ERROR(CheckSize(s.kv_channels_v(), name("kv_channels_v")));
    o.kv_channels_v = s.kv_channels_v();
  }
  if (s.has_num_gqa_groups()) {
    RETURN_IF_ERROR(CheckSize(s.num_gqa_groups(), name("num_gqa_groups")));
    o.num_gqa_groups = s.num_gqa_groups();
  }
  o.attention_dropout = s.attention_dropout();
  if (!s.qkv_format().empty()) {
    ASSIGN_OR_RETURN(o.qkv_format, kernels::ParseQkvFormat(s.qkv_format(), name("qkv_format")));
  }
  if (!s.attn_mask_type().empty()) {
    ASSIGN_OR_RETURN(o.attn_mask_type, kernels::ParseAttnMaskType(s.attn_mask_type(), name("attn_mask_type")));
  }
  if (s.has_window_size()) o.window_size = AttentionWindow{s.window_size().left(), s.window_size().right()};
  if (s.has_softmax_scale()) o.softmax_scale = s.softmax_scale();
  if (!s.softmax_type().empty()) {
    ASSIGN_OR_RETURN(o.softmax_type, kernels::ParseSoftmaxType(s.softmax_type(), name("softmax_type")));
  }
  if (!s.core_attention_bias_type().empty()) {
    ASSIGN_OR_RETURN(o.core_attention_bias_type,
                     kernels::ParseAttnBiasType(s.core_attention_bias_type(), name("core_attention_bias_type")));
  }
  o.return_max_logit = s.return_max_logit();
  o.checkpoint_core_attention = s.checkpoint_core_attention();
  RETURN_IF_ERROR(ValidateDotProductAttentionOptions(o, field));
  return o;
}

absl::Status CheckDotProductAttentionPlace(const v1::DotProductAttentionSpec& spec, int index, int count,
                                           absl::string_view field) {
  if (index != 0) {
    return InvalidField(absl::StrCat(field, ".dot_product_attention"),
                        "the first layer of the stack (it reads the query, key and value inputs)",
                        absl::StrCat("layer ", index));
  }
  if (spec.return_max_logit() && index + 1 != count) {
    return InvalidField(absl::StrCat(field, ".dot_product_attention.return_max_logit"),
                        "false (only the last layer of a stack may return max_logit as a second output)", "true");
  }
  return absl::OkStatus();
}

int64_t DotProductAttentionOutputWidth(const DotProductAttentionOptions& o) {
  return o.num_attention_heads * (o.kv_channels_v > 0 ? o.kv_channels_v : o.kv_channels);
}

}  // namespace layers
}  // namespace teserve
