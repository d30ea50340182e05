// Recipe: the quantization configuration of a session (what TE's recipe objects hold),
// parsed and validated from the wire RecipeSpec. Configuration only; the state that
// persists across steps lives in ScalingState, owned by each Quantizer.
//
// Extension point: a new recipe adds a config struct to Recipe::Config, a branch in
// RecipeFromProto and a Quantizer subclass (recipes/quantizer.h).
#ifndef TESERVE_RECIPES_RECIPE_H_
#define TESERVE_RECIPES_RECIPE_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/variant.h"
#include "core/dtype.h"
#include "teserve/v1/model.pb.h"

namespace teserve {
namespace recipes {

enum class Fp8Format { kHybrid, kE4M3 };
enum class AmaxComputeAlgo { kMax, kMostRecent };

// The GEMM operands a layer quantizes (TE's forward / backward meta).
enum class TensorRole { kInput, kWeight, kGradOutput };
absl::string_view TensorRoleName(TensorRole role);  // "input", "weight", "grad_output"
bool IsForwardRole(TensorRole role);

struct DelayedScalingConfig {
  float margin = 0.0f;
  Fp8Format fp8_format = Fp8Format::kHybrid;
  int amax_history_len = 1024;
  AmaxComputeAlgo amax_compute_algo = AmaxComputeAlgo::kMax;
  bool reduce_amax = true;
};

struct CurrentScalingConfig {
  Fp8Format fp8_format = Fp8Format::kHybrid;
  bool power_2_scale = false;
  float amax_epsilon = 0.0f;
};

struct Recipe {
  using Config = absl::variant<absl::monostate, DelayedScalingConfig, CurrentScalingConfig>;

  bool enabled = true;
  bool calibrating = false;
  Config config;  // monostate: no recipe, high precision

  // "none", "delayed", "current".
  std::string name() const;
  // True when GEMM operands are quantized (a recipe is set and enabled).
  bool quantizes() const;
};

// HYBRID: E4M3 for forward operands, E5M2 for gradients; E4M3: E4M3 everywhere.
DType FormatFor(Fp8Format format, TensorRole role);

// Parses and validates; errors are INVALID_ARGUMENT naming the field under `field`
// ("recipe.delayed.amax_history_len: expected 1..65536, got 0").
absl::StatusOr<Recipe> RecipeFromProto(const v1::RecipeSpec& spec, absl::string_view field = "recipe");

}  // namespace recipes
}  // namespace teserve

#endif  // TESERVE_RECIPES_RECIPE_H_
