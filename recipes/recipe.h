// Recipe: the quantization configuration of a session (what TE's recipe objects hold),
// parsed and validated from the wire RecipeSpec. Configuration only; the state that
// persists across steps lives in ScalingState, owned by each Quantizer.
//
// Extension point: a new recipe adds a config struct to Recipe::Config, a branch in
// RecipeFromProto and a Quantizer subclass (recipes/quantizer.h).
#ifndef TESERVE_RECIPES_RECIPE_H_
#define TESERVE_RECIPES_RECIPE_H_

#include <cstdint>
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

// MXFP8BlockScaling: 1x32 / 32x1 blocks, E8M0 scales rounded up.
struct Mxfp8Config {
  Fp8Format fp8_format = Fp8Format::kE4M3;
};

// Float8BlockScaling: 1x128 (dim 1) or 128x128 (dim 2) blocks with FP32 scales.
struct BlockScalingConfig {
  Fp8Format fp8_format = Fp8Format::kE4M3;
  int x_block_scaling_dim = 1;
  int w_block_scaling_dim = 2;
  int grad_block_scaling_dim = 1;
  bool power_2_scale = true;
  float amax_epsilon = 0.0f;
};

// NVFP4BlockScaling: E2M1 data, E4M3 scales per 16 elements, FP32 per-tensor scale.
struct Nvfp4Config {
  bool random_hadamard = true;      // on the wgrad (columnwise) copies of input and grad_output
  bool stochastic_rounding = true;  // grad_output only
  bool two_d = true;                // 16x16 blocks for weights
};

struct Recipe {
  using Config = absl::variant<absl::monostate, DelayedScalingConfig, CurrentScalingConfig, Mxfp8Config,
                               BlockScalingConfig, Nvfp4Config>;

  bool enabled = true;
  bool calibrating = false;
  Config config;  // monostate: no recipe, high precision

  // "none", "delayed", "current", "mxfp8", "block", "nvfp4".
  std::string name() const;
  // True when GEMM operands are quantized (a recipe is set, enabled, not calibrating).
  bool quantizes() const;
  // True when layers own quantizers: quantizing, or calibrating (amaxes are collected
  // and scales updated, but GEMMs run in high precision, as TE's calibration does).
  bool has_quantizers() const;
  // Divisor the Linear feature sizes and the token count (rows) must have so that every
  // block of the recipe tiles the operands: 32 for MXFP8, 16 for NVFP4, else 1.
  int64_t block_multiple() const;
};

// HYBRID: E4M3 for forward operands, E5M2 for gradients; E4M3: E4M3 everywhere.
// (NVFP4 data is always E2M1; this gives the FP8 formats of the other recipes.)
DType FormatFor(Fp8Format format, TensorRole role);

// Parses and validates; errors are INVALID_ARGUMENT naming the field under `field`
// ("recipe.delayed.amax_history_len: expected 1..65536, got 0").
absl::StatusOr<Recipe> RecipeFromProto(const v1::RecipeSpec& spec, absl::string_view field = "recipe");

}  // namespace recipes
}  // namespace teserve

#endif  // TESERVE_RECIPES_RECIPE_H_
