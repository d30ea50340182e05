// Wire specs of LayerNormLinear and LayerNormMLP -> validated layer options, for
// layers/spec.cc. Every error is INVALID_ARGUMENT naming the field under `field` and
// saying expected vs got, e.g.
//   model.layers[2].layer_norm_mlp.activation: expected one of gelu, ..., got 'gelu2'
// Checked here: sizes (1..2^24), eps (finite > 0), init_std (finite >= 0),
// normalization ("LayerNorm" | "RMSNorm", default LayerNorm), activation (TE's names,
// default gelu), activation_params (clamped_swiglu only; limit, alpha finite > 0),
// parameters_split (all sizes 0: equal blocks; else sizes > 0 summing to out_features;
// names non-empty and unique), and that the recipe's blocks tile every GEMM dimension
// (in/out features; hidden_size and ffn_hidden_size). The returned options have seed 0.
#ifndef TESERVE_LAYERS_LAYERNORM_SPEC_H_
#define TESERVE_LAYERS_LAYERNORM_SPEC_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "layers/layernorm_linear.h"
#include "layers/layernorm_mlp.h"
#include "recipes/recipe.h"
#include "teserve/v1/model.pb.h"

namespace teserve {
namespace layers {

absl::StatusOr<LayerNormLinearOptions> LayerNormLinearOptionsFromSpec(const v1::LayerNormLinearSpec& spec,
                                                                      const recipes::Recipe& recipe,
                                                                      absl::string_view field);

absl::StatusOr<LayerNormMLPOptions> LayerNormMLPOptionsFromSpec(const v1::LayerNormMLPSpec& spec,
                                                                const recipes::Recipe& recipe,
                                                                absl::string_view field);

// Elements of every parameter the layer holds.
int64_t ParameterCount(const LayerNormLinearOptions& options);
int64_t ParameterCount(const LayerNormMLPOptions& options);

}  // namespace layers
}  // namespace teserve

#endif  // TESERVE_LAYERS_LAYERNORM_SPEC_H_
