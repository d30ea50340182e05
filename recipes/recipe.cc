#include "recipes/recipe.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace teserve {
namespace recipes {
namespace {

// Longest history accepted: TE's default is 1024; longer windows only cost memory.
constexpr int kMaxAmaxHistoryLen = 65536;

absl::StatusOr<Fp8Format> ParseFormat(v1::Fp8Format format, absl::string_view field) {
  switch (format) {
    case v1::FP8_FORMAT_UNSPECIFIED:
    case v1::HYBRID:
      return Fp8Format::kHybrid;
    case v1::E4M3:
      return Fp8Format::kE4M3;
    case v1::E5M2:
      return InvalidField(field, "HYBRID or E4M3 (pure E5M2 is not supported for training)",
                          "E5M2");
    default:
      return InvalidField(field, "HYBRID or E4M3", absl::StrCat("enum value ", static_cast<int>(format)));
  }
}

absl::Status CheckFiniteNonNegative(float value, absl::string_view field) {
  if (!std::isfinite(value) || value < 0.0f) {
    return InvalidField(field, "a finite value >= 0", value);
  }
  return absl::OkStatus();
}

absl::StatusOr<DelayedScalingConfig> ParseDelayed(const v1::DelayedScaling& spec,
                                                  absl::string_view field) {
  DelayedScalingConfig config;
  if (spec.has_margin()) {
    RETURN_IF_ERROR(CheckFiniteNonNegative(spec.margin(), absl::StrCat(field, ".margin")));
    config.margin = spec.margin();
  }
  ASSIGN_OR_RETURN(config.fp8_format, ParseFormat(spec.fp8_format(), absl::StrCat(field, ".fp8_format")));
  if (spec.has_amax_history_len()) {
    if (spec.amax_history_len() < 1 || spec.amax_history_len() > kMaxAmaxHistoryLen) {
      return InvalidField(absl::StrCat(field, ".amax_history_len"),
                          absl::StrCat("1..", kMaxAmaxHistoryLen), spec.amax_history_len());
    }
    config.amax_history_len = spec.amax_history_len();
  }
  const std::string& algo = spec.amax_compute_algo();
  if (algo.empty() || algo == "max") {
    config.amax_compute_algo = AmaxComputeAlgo::kMax;
  } else if (algo == "most_recent") {
    config.amax_compute_algo = AmaxComputeAlgo::kMostRecent;
  } else {
    return InvalidField(absl::StrCat(field, ".amax_compute_algo"), "\"max\" or \"most_recent\"",
                        absl::StrCat("\"", algo, "\""));
  }
  if (spec.has_reduce_amax()) config.reduce_amax = spec.reduce_amax();
  return config;
}

absl::StatusOr<CurrentScalingConfig> ParseCurrent(const v1::Float8CurrentScaling& spec,
                                                  absl::string_view field) {
  CurrentScalingConfig config;
  ASSIGN_OR_RETURN(config.fp8_format, ParseFormat(spec.fp8_format(), absl::StrCat(field, ".fp8_format")));
  config.power_2_scale = spec.power_2_scale();
  RETURN_IF_ERROR(CheckFiniteNonNegative(spec.amax_epsilon(), absl::StrCat(field, ".amax_epsilon")));
  config.amax_epsilon = spec.amax_epsilon();
  return config;
}

absl::StatusOr<Fp8Format> ParseBlockFormat(v1::Fp8Format format, absl::string_view field) {
  // TE's block recipes default to E4M3 everywhere; HYBRID is accepted explicitly.
  if (format == v1::FP8_FORMAT_UNSPECIFIED) return Fp8Format::kE4M3;
  return ParseFormat(format, field);
}

absl::StatusOr<BlockScalingConfig> ParseBlock(const v1::Float8BlockScaling& spec, absl::string_view field) {
  BlockScalingConfig config;
  ASSIGN_OR_RETURN(config.fp8_format, ParseBlockFormat(spec.fp8_format(), absl::StrCat(field, ".fp8_format")));
  if (spec.has_x_block_scaling_dim()) config.x_block_scaling_dim = spec.x_block_scaling_dim();
  if (spec.has_w_block_scaling_dim()) config.w_block_scaling_dim = spec.w_block_scaling_dim();
  if (spec.has_grad_block_scaling_dim()) config.grad_block_scaling_dim = spec.grad_block_scaling_dim();
  // Every GEMM pairs a 1D-scaled operand with a 1D or 2D one (2D x 2D is not used),
  // and activations/gradients change every step, so they use 1x128 blocks.
  if (config.x_block_scaling_dim != 1) {
    return InvalidField(absl::StrCat(field, ".x_block_scaling_dim"), "1 (inputs use 1x128 blocks)",
                        config.x_block_scaling_dim);
  }
  if (config.grad_block_scaling_dim != 1) {
    return InvalidField(absl::StrCat(field, ".grad_block_scaling_dim"), "1 (gradients use 1x128 blocks)",
                        config.grad_block_scaling_dim);
  }
  if (config.w_block_scaling_dim != 1 && config.w_block_scaling_dim != 2) {
    return InvalidField(absl::StrCat(field, ".w_block_scaling_dim"), "1 (1x128) or 2 (128x128)",
                        config.w_block_scaling_dim);
  }
  if (spec.has_power_2_scale()) config.power_2_scale = spec.power_2_scale();
  RETURN_IF_ERROR(CheckFiniteNonNegative(spec.amax_epsilon(), absl::StrCat(field, ".amax_epsilon")));
  config.amax_epsilon = spec.amax_epsilon();
  return config;
}

}  // namespace

absl::string_view TensorRoleName(TensorRole role) {
  switch (role) {
    case TensorRole::kInput: return "input";
    case TensorRole::kWeight: return "weight";
    case TensorRole::kGradOutput: return "grad_output";
  }
  return "unknown";
}

bool IsForwardRole(TensorRole role) { return role != TensorRole::kGradOutput; }

std::string Recipe::name() const {
  if (absl::holds_alternative<DelayedScalingConfig>(config)) return "delayed";
  if (absl::holds_alternative<CurrentScalingConfig>(config)) return "current";
  if (absl::holds_alternative<Mxfp8Config>(config)) return "mxfp8";
  if (absl::holds_alternative<BlockScalingConfig>(config)) return "block";
  if (absl::holds_alternative<Nvfp4Config>(config)) return "nvfp4";
  return "none";
}

bool Recipe::has_quantizers() const {
  return enabled && !absl::holds_alternative<absl::monostate>(config);
}

bool Recipe::quantizes() const { return has_quantizers() && !calibrating; }

int64_t Recipe::block_multiple() const {
  if (!has_quantizers()) return 1;
  if (absl::holds_alternative<Mxfp8Config>(config)) return 32;
  if (absl::holds_alternative<Nvfp4Config>(config)) return 16;
  return 1;
}

DType FormatFor(Fp8Format format, TensorRole role) {
  if (format == Fp8Format::kHybrid && !IsForwardRole(role)) return DType::kFloat8E5M2;
  return DType::kFloat8E4M3;
}

absl::StatusOr<Recipe> RecipeFromProto(const v1::RecipeSpec& spec, absl::string_view field) {
  Recipe recipe;
  recipe.enabled = spec.has_enabled() ? spec.enabled() : true;
  recipe.calibrating = spec.calibrating();
  switch (spec.recipe_case()) {
    case v1::RecipeSpec::kDelayed: {
      ASSIGN_OR_RETURN(recipe.config, ParseDelayed(spec.delayed(), absl::StrCat(field, ".delayed")));
      break;
    }
    case v1::RecipeSpec::kCurrent: {
      ASSIGN_OR_RETURN(recipe.config, ParseCurrent(spec.current(), absl::StrCat(field, ".current")));
      break;
    }
    case v1::RecipeSpec::kMxfp8: {
      Mxfp8Config config;
      ASSIGN_OR_RETURN(config.fp8_format, ParseBlockFormat(spec.mxfp8().fp8_format(),
                                                           absl::StrCat(field, ".mxfp8.fp8_format")));
      recipe.config = config;
      break;
    }
    case v1::RecipeSpec::kBlock: {
      ASSIGN_OR_RETURN(recipe.config, ParseBlock(spec.block(), absl::StrCat(field, ".block")));
      break;
    }
    case v1::RecipeSpec::kNvfp4: {
      const v1::Fp8Format scale_format = spec.nvfp4().fp8_format();
      if (scale_format != v1::FP8_FORMAT_UNSPECIFIED && scale_format != v1::E4M3) {
        return InvalidField(absl::StrCat(field, ".nvfp4.fp8_format"),
                            "E4M3 (NVFP4 block scales are E4M3; per-direction formats do not apply)",
                            v1::Fp8Format_IsValid(scale_format) ? v1::Fp8Format_Name(scale_format)
                                                                : absl::StrCat("enum value ", static_cast<int>(scale_format)));
      }
      Nvfp4Config config;
      config.random_hadamard = !spec.nvfp4().disable_rht();
      config.stochastic_rounding = !spec.nvfp4().disable_stochastic_rounding();
      config.two_d = !spec.nvfp4().disable_2d_quantization();
      recipe.config = config;
      break;
    }
    case v1::RecipeSpec::RECIPE_NOT_SET:
      if (recipe.calibrating) {
        return InvalidField(absl::StrCat(field, ".calibrating"), "a recipe to calibrate", "no recipe set");
      }
      break;
  }
  return recipe;
}

}  // namespace recipes
}  // namespace teserve
