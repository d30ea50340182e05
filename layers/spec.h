// Builds a LayerStack from the wire ModelSpec, validating it first. Every error is
// INVALID_ARGUMENT naming the field and saying expected vs got, e.g.
//   model.layers[1].linear.in_features: expected 64 (the output width of layer 'norm'), got 32
#ifndef TESERVE_LAYERS_SPEC_H_
#define TESERVE_LAYERS_SPEC_H_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "layers/layer_stack.h"
#include "recipes/recipe.h"
#include "teserve/v1/model.pb.h"

namespace teserve {
namespace layers {

// Parameters a model may hold in total (elements); larger models are rejected with
// RESOURCE_EXHAUSTED before anything is allocated.
inline constexpr int64_t kMaxModelParameters = int64_t{1} << 32;

absl::StatusOr<std::unique_ptr<LayerStack>> BuildStack(const v1::ModelSpec& spec,
                                                       const recipes::Recipe& recipe);

}  // namespace layers
}  // namespace teserve

#endif  // TESERVE_LAYERS_SPEC_H_
