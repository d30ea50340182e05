#include "layers/layernorm_spec.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "layers/spec_checks.h"

namespace teserve {
namespace layers {
namespace {

// TE's two forms: names only (every size 0) cut out_features into equal blocks.
absl::StatusOr<ParametersSplit> SplitFromSpec(const v1::LayerNormLinearSpec& spec, absl::string_view field) {
  ParametersSplit split;
  bool all_zero = true;
  for (const v1::ParameterSplit& s : spec.parameters_split()) {
    split.emplace_back(s.name(), s.size());
    all_zero = all_zero && s.size() == 0;
  }
  if (!split.empty() && all_zero) {
    const int64_t n = static_cast<int64_t>(split.size());
    if (spec.out_features() % n != 0) {
      return InvalidField(field,
                          absl::StrCat("blocks that divide out_features ", spec.out_features(),
                                       " equally (every size 0), or explicit sizes"),
                          absl::StrCat(n, " blocks"));
    }
    for (auto& block : split) block.second = spec.out_features() / n;
  }
  RETURN_IF_ERROR(ValidateParametersSplit(split, spec.out_features(), field));
  return split;
}

}  // namespace

absl::StatusOr<LayerNormLinearOptions> LayerNormLinearOptionsFromSpec(const v1::LayerNormLinearSpec& spec,
                                                                      const recipes::Recipe& recipe,
                                                                      absl::string_view field) {
  LayerNormLinearOptions o;
  RETURN_IF_ERROR(CheckSize(spec.in_features(), absl::StrCat(field, ".in_features")));
  RETURN_IF_ERROR(CheckSize(spec.out_features(), absl::StrCat(field, ".out_features")));
  if (spec.has_eps()) RETURN_IF_ERROR(CheckPositiveFinite(spec.eps(), absl::StrCat(field, ".eps")));
  RETURN_IF_ERROR(CheckInitStd(spec.has_init_std(), spec.init_std(), absl::StrCat(field, ".init_std")));
  ASSIGN_OR_RETURN(o.normalization, ParseNormalization(spec.normalization(), absl::StrCat(field, ".normalization")));
  ASSIGN_OR_RETURN(o.parameters_split, SplitFromSpec(spec, absl::StrCat(field, ".parameters_split")));
  RETURN_IF_ERROR(CheckTiles(spec.in_features(), recipe, absl::StrCat(field, ".in_features")));
  RETURN_IF_ERROR(CheckTiles(spec.out_features(), recipe, absl::StrCat(field, ".out_features")));
  o.in_features = spec.in_features();
  o.out_features = spec.out_features();
  if (spec.has_eps()) o.eps = spec.eps();
  o.bias = spec.has_bias() ? spec.bias() : true;
  o.zero_centered_gamma = spec.zero_centered_gamma();
  o.return_bias = spec.return_bias();
  o.return_layernorm_output = spec.return_layernorm_output();
  if (spec.has_init_std()) o.init_std = spec.init_std();
  return o;
}

absl::StatusOr<LayerNormMLPOptions> LayerNormMLPOptionsFromSpec(const v1::LayerNormMLPSpec& spec,
                                                                const recipes::Recipe& recipe,
                                                                absl::string_view field) {
  LayerNormMLPOptions o;
  RETURN_IF_ERROR(CheckSize(spec.hidden_size(), absl::StrCat(field, ".hidden_size")));
  RETURN_IF_ERROR(CheckSize(spec.ffn_hidden_size(), absl::StrCat(field, ".ffn_hidden_size")));
  if (spec.has_eps()) RETURN_IF_ERROR(CheckPositiveFinite(spec.eps(), absl::StrCat(field, ".eps")));
  RETURN_IF_ERROR(CheckInitStd(spec.has_init_std(), spec.init_std(), absl::StrCat(field, ".init_std")));
  ASSIGN_OR_RETURN(o.normalization, ParseNormalization(spec.normalization(), absl::StrCat(field, ".normalization")));
  if (!spec.activation().empty()) {
    ASSIGN_OR_RETURN(o.activation, kernels::ParseActivation(spec.activation(), absl::StrCat(field, ".activation")));
  }
  if (spec.has_activation_params()) {
    const std::string f = absl::StrCat(field, ".activation_params");
    if (o.activation != kernels::Activation::kClampedSwiglu) {
      return InvalidField(f, "unset (activation_params apply to clamped_swiglu only)",
                          absl::StrCat("set with activation '", kernels::ActivationName(o.activation), "'"));
    }
    const v1::ActivationParams& p = spec.activation_params();
    if (p.has_limit()) {
      RETURN_IF_ERROR(CheckPositiveFinite(p.limit(), absl::StrCat(f, ".limit")));
      o.activation_params.limit = p.limit();
    }
    if (p.has_alpha()) {
      RETURN_IF_ERROR(CheckPositiveFinite(p.alpha(), absl::StrCat(f, ".alpha")));
      o.activation_params.alpha = p.alpha();
    }
  }
  RETURN_IF_ERROR(CheckTiles(spec.hidden_size(), recipe, absl::StrCat(field, ".hidden_size")));
  RETURN_IF_ERROR(CheckTiles(spec.ffn_hidden_size(), recipe, absl::StrCat(field, ".ffn_hidden_size")));
  o.hidden_size = spec.hidden_size();
  o.ffn_hidden_size = spec.ffn_hidden_size();
  if (spec.has_eps()) o.eps = spec.eps();
  o.bias = spec.has_bias() ? spec.bias() : true;
  o.return_layernorm_output = spec.return_layernorm_output();
  o.return_bias = spec.return_bias();
  o.zero_centered_gamma = spec.zero_centered_gamma();
  o.checkpoint = spec.checkpoint();
  if (spec.has_init_std()) o.init_std = spec.init_std();
  return o;
}

int64_t ParameterCount(const LayerNormLinearOptions& o) {
  return NormParameterCount(o.normalization, o.in_features) + o.in_features * o.out_features +
         (o.bias ? o.out_features : 0);
}

int64_t ParameterCount(const LayerNormMLPOptions& o) {
  const int64_t fc1_width = kernels::ActivationInputWidth(o.activation, o.ffn_hidden_size);
  return NormParameterCount(o.normalization, o.hidden_size) + o.hidden_size * fc1_width +
         o.ffn_hidden_size * o.hidden_size + (o.bias ? fc1_width + o.hidden_size : 0);
}

}  // namespace layers
}  // namespace teserve
