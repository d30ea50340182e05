// MultiheadAttentionSpec (proto) -> MultiheadAttentionOptions, for layers/spec.cc.
// Every error is INVALID_ARGUMENT naming the spec field under `field` and saying
// expected vs got, e.g.
//   model.layers[0].multihead_attention.num_gqa_groups: expected a divisor of num_attention_heads 8, got 3
// Checked here: sizes (1..2^24, also num_attention_heads * kv_channels), TE's names for
// the string fields (attn_mask_type, qkv_format, softmax_type, attention_type,
// normalization, qk_norm_type), the rotary dimension floor(kv_channels * rotary_percent)
// (even, > 0), eps values (finite > 0), init stds (finite >= 0), that the recipe's
// blocks tile every GEMM dimension (hidden_size, the query and the key/value widths),
// then ValidateMultiheadAttentionOptions (hidden_size divisible by the heads unless
// kv_channels is set, heads by the GQA groups, dropout, window and mask/format
// combinations). The returned options have seed 0.
#ifndef TESERVE_LAYERS_MULTIHEAD_ATTENTION_SPEC_H_
#define TESERVE_LAYERS_MULTIHEAD_ATTENTION_SPEC_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "layers/multihead_attention.h"
#include "recipes/recipe.h"
#include "teserve/v1/model.pb.h"

namespace teserve {
namespace layers {

absl::StatusOr<MultiheadAttentionOptions> MultiheadAttentionOptionsFromSpec(const v1::MultiheadAttentionSpec& spec,
                                                                            const recipes::Recipe& recipe,
                                                                            absl::string_view field);

// Elements of every parameter the layer holds.
int64_t ParameterCount(const MultiheadAttentionOptions& options);

}  // namespace layers
}  // namespace teserve

#endif  // TESERVE_LAYERS_MULTIHEAD_ATTENTION_SPEC_H_
