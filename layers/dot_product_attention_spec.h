// DotProductAttentionSpec (proto) -> DotProductAttentionOptions, and where the layer
// may sit in a stack. Errors are INVALID_ARGUMENT naming the spec field under `field`
// ("model.layers[0].dot_product_attention.attn_mask_type: expected one of ...").
#ifndef TESERVE_LAYERS_DOT_PRODUCT_ATTENTION_SPEC_H_
#define TESERVE_LAYERS_DOT_PRODUCT_ATTENTION_SPEC_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "layers/dot_product_attention.h"
#include "teserve/v1/model.pb.h"

namespace teserve {
namespace layers {

// Parses and validates every field (sizes in 1..2^24, TE's names for the string
// fields, then ValidateDotProductAttentionOptions). The seed is left 0.
absl::StatusOr<DotProductAttentionOptions> DotProductAttentionOptionsFromSpec(const v1::DotProductAttentionSpec& spec,
                                                                              absl::string_view field);

// The layer reads query, key and value, so it must be layer 0 of the stack; with
// return_max_logit it returns a second output, so it must also be the last layer.
// `field` names the layer ("model.layers[2]").
absl::Status CheckDotProductAttentionPlace(const v1::DotProductAttentionSpec& spec, int index, int count,
                                           absl::string_view field);

// Width of the output's last dimension: num_attention_heads * kv_channels_v.
int64_t DotProductAttentionOutputWidth(const DotProductAttentionOptions& options);

}  // namespace layers
}  // namespace teserve

#endif  // TESERVE_LAYERS_DOT_PRODUCT_ATTENTION_SPEC_H_
