// TransformerLayerSpec (proto) -> TransformerLayerOptions, for layers/spec.cc.
// The attention and MLP arguments are checked by the MultiheadAttention and LayerNormMLP
// spec parsers, with errors renamed to the TransformerLayer's argument names
// ("model.layers[0].transformer_layer.self_attn_mask_type: expected one of ...");
// then ValidateTransformerLayerOptions. The returned options have seed 0.
#ifndef TESERVE_LAYERS_TRANSFORMER_LAYER_SPEC_H_
#define TESERVE_LAYERS_TRANSFORMER_LAYER_SPEC_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "layers/transformer_layer.h"
#include "recipes/recipe.h"
#include "teserve/v1/model.pb.h"

namespace teserve {
namespace layers {

absl::StatusOr<TransformerLayerOptions> TransformerLayerOptionsFromSpec(const v1::TransformerLayerSpec& spec,
                                                                        const recipes::Recipe& recipe,
                                                                        absl::string_view field);

// Elements of every parameter the layer holds.
int64_t ParameterCount(const TransformerLayerOptions& options);

}  // namespace layers
}  // namespace teserve

#endif  // TESERVE_LAYERS_TRANSFORMER_LAYER_SPEC_H_
