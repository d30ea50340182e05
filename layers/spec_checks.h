// Field checks shared by the ModelSpec parsers (layers/spec.cc and layers/*_spec.cc).
// Each returns OK or INVALID_ARGUMENT naming `field` and saying expected vs got, e.g.
//   model.layers[0].linear.in_features: expected a size in 1..16777216, got 0
#ifndef TESERVE_LAYERS_SPEC_CHECKS_H_
#define TESERVE_LAYERS_SPEC_CHECKS_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "layers/normalization.h"
#include "recipes/recipe.h"

namespace teserve {
namespace layers {

// Largest single dimension a spec may set; keeps every product of two sizes below
// int64 overflow.
inline constexpr int64_t kMaxDim = int64_t{1} << 24;

// A size: 1..kMaxDim.
absl::Status CheckSize(int64_t value, absl::string_view field);

// Finite and > 0 (eps values, activation limits).
absl::Status CheckPositiveFinite(float value, absl::string_view field);

// An init std, when set (`has`): finite and >= 0.
absl::Status CheckInitStd(bool has, float value, absl::string_view field);

// TE's normalization names: "LayerNorm" (also when empty) or "RMSNorm".
absl::StatusOr<NormKind> ParseNormalization(const std::string& name, absl::string_view field);

// A GEMM dimension the recipe's blocks must tile: a multiple of recipe.block_multiple().
// `what`, when set, describes a derived value and ends in a space
// ("num_attention_heads * kv_channels (the query width) "); the message then reads
// "expected <what>to be a multiple of ...".
absl::Status CheckTiles(int64_t value, const recipes::Recipe& recipe, absl::string_view field,
                        absl::string_view what = "");

// Elements of a LayerNorm (gamma, beta) or RMSNorm (gamma) over `width`.
int64_t NormParameterCount(NormKind kind, int64_t width);

}  // namespace layers
}  // namespace teserve

#endif  // TESERVE_LAYERS_SPEC_CHECKS_H_
