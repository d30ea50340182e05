#include "layers/spec.h"

#include <cmath>
#include <limits>
#include <string>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "layers/grouped_linear.h"
#include "layers/dot_product_attention_spec.h"
#include "layers/init.h"
#include "layers/layernorm_spec.h"
#include "layers/linear.h"
#include "layers/multihead_attention_spec.h"
#include "layers/normalization.h"
#include "layers/transformer_layer_spec.h"

namespace teserve {
namespace layers {
namespace {

// Largest single dimension accepted; keeps every product below int64 overflow.
constexpr int64_t kMaxDim = int64_t{1} << 24;
// Most GEMMs one GroupedLinear may hold (each is a Linear with its own quantizers).
constexpr int64_t kMaxGemms = 4096;

absl::Status CheckSize(int64_t value, absl::string_view field) {
  if (value <= 0 || value > kMaxDim) {
    return InvalidField(field, absl::StrCat("a size in 1..", kMaxDim), value);
  }
  return absl::OkStatus();
}

absl::Status CheckPositiveFinite(float value, absl::string_view field) {
  if (!std::isfinite(value) || value <= 0.0f) return InvalidField(field, "a finite value > 0", value);
  return absl::OkStatus();
}

// Input width -> output width of one layer, after checking its arguments.
struct LayerPlan {
  std::string name;
  int64_t in_width = 0;
  int64_t out_width = 0;
  int64_t num_parameters = 0;
  std::string in_width_field;  // the field a width mismatch names, when the kind sets it
  std::string extra_outputs_field;  // set: a flag adding outputs, allowed on the last layer only
};

absl::StatusOr<LayerPlan> PlanLayer(const v1::LayerSpec& layer, absl::string_view field,
                                    const recipes::Recipe& recipe) {
  LayerPlan plan;
  switch (layer.kind_case()) {
    case v1::LayerSpec::kLinear: {
      const v1::LinearSpec& s = layer.linear();
      const std::string f = absl::StrCat(field, ".linear");
      RETURN_IF_ERROR(CheckSize(s.in_features(), absl::StrCat(f, ".in_features")));
      RETURN_IF_ERROR(CheckSize(s.out_features(), absl::StrCat(f, ".out_features")));
      if (s.has_init_std() && (!std::isfinite(s.init_std()) || s.init_std() < 0.0f)) {
        return InvalidField(absl::StrCat(f, ".init_std"), "a finite value >= 0", s.init_std());
      }
      plan.in_width = s.in_features();
      plan.out_width = s.out_features();
      plan.num_parameters = s.in_features() * s.out_features() + (s.has_bias() && !s.bias() ? 0 : s.out_features());
      return plan;
    }
    case v1::LayerSpec::kLayerNorm:
    case v1::LayerSpec::kRmsNorm: {
      const bool ln = layer.kind_case() == v1::LayerSpec::kLayerNorm;
      const std::string f = absl::StrCat(field, ln ? ".layer_norm" : ".rms_norm");
      const int64_t hidden = ln ? layer.layer_norm().hidden_size() : layer.rms_norm().hidden_size();
      const bool has_eps = ln ? layer.layer_norm().has_eps() : layer.rms_norm().has_eps();
      const float eps = ln ? layer.layer_norm().eps() : layer.rms_norm().eps();
      RETURN_IF_ERROR(CheckSize(hidden, absl::StrCat(f, ".hidden_size")));
      if (has_eps) RETURN_IF_ERROR(CheckPositiveFinite(eps, absl::StrCat(f, ".eps")));
      plan.in_width = plan.out_width = hidden;
      plan.num_parameters = hidden * (ln ? 2 : 1);
      return plan;
    }
    case v1::LayerSpec::kGroupedLinear: {
      const v1::GroupedLinearSpec& s = layer.grouped_linear();
      const std::string f = absl::StrCat(field, ".grouped_linear");
      if (s.num_gemms() < 1 || s.num_gemms() > kMaxGemms) {
        return InvalidField(absl::StrCat(f, ".num_gemms"), absl::StrCat("a count in 1..", kMaxGemms), s.num_gemms());
      }
      RETURN_IF_ERROR(CheckSize(s.in_features(), absl::StrCat(f, ".in_features")));
      RETURN_IF_ERROR(CheckSize(s.out_features(), absl::StrCat(f, ".out_features")));
      if (s.has_init_std() && (!std::isfinite(s.init_std()) || s.init_std() < 0.0f)) {
        return InvalidField(absl::StrCat(f, ".init_std"), "a finite value >= 0", s.init_std());
      }
      plan.in_width = s.in_features();
      plan.out_width = s.out_features();
      plan.num_parameters =
          s.num_gemms() * (s.in_features() * s.out_features() + (s.has_bias() && !s.bias() ? 0 : s.out_features()));
      plan.in_width_field = absl::StrCat(f, ".in_features");
      return plan;
    }
    case v1::LayerSpec::kDotProductAttention: {
      // Three inputs (query, key, value): no single input width; first layer only.
      ASSIGN_OR_RETURN(DotProductAttentionOptions o,
                       DotProductAttentionOptionsFromSpec(layer.dot_product_attention(),
                                                          absl::StrCat(field, ".dot_product_attention")));
      plan.out_width = DotProductAttentionOutputWidth(o);
      plan.num_parameters = o.softmax_type == kernels::SoftmaxType::kLearnable ? o.num_attention_heads : 0;
      return plan;
    }
    case v1::LayerSpec::kLayerNormLinear: {
      const std::string f = absl::StrCat(field, ".layer_norm_linear");
      ASSIGN_OR_RETURN(LayerNormLinearOptions o, LayerNormLinearOptionsFromSpec(layer.layer_norm_linear(), recipe, f));
      plan.in_width = o.in_features;
      plan.out_width = o.out_features;
      plan.num_parameters = ParameterCount(o);
      plan.in_width_field = absl::StrCat(f, ".in_features");
      if (o.return_bias || o.return_layernorm_output) {
        plan.extra_outputs_field = absl::StrCat(f, o.return_bias ? ".return_bias" : ".return_layernorm_output");
      }
      return plan;
    }
    case v1::LayerSpec::kLayerNormMlp: {
      const std::string f = absl::StrCat(field, ".layer_norm_mlp");
      ASSIGN_OR_RETURN(LayerNormMLPOptions o, LayerNormMLPOptionsFromSpec(layer.layer_norm_mlp(), recipe, f));
      plan.in_width = plan.out_width = o.hidden_size;
      plan.num_parameters = ParameterCount(o);
      plan.in_width_field = absl::StrCat(f, ".hidden_size");
      if (o.return_bias || o.return_layernorm_output) {
        plan.extra_outputs_field = absl::StrCat(f, o.return_bias ? ".return_bias" : ".return_layernorm_output");
      }
      return plan;
    }
    case v1::LayerSpec::kMultiheadAttention: {
      const std::string f = absl::StrCat(field, ".multihead_attention");
      ASSIGN_OR_RETURN(MultiheadAttentionOptions o,
                       MultiheadAttentionOptionsFromSpec(layer.multihead_attention(), recipe, f));
      plan.in_width = plan.out_width = o.hidden_size;
      plan.num_parameters = ParameterCount(o);
      plan.in_width_field = absl::StrCat(f, ".hidden_size");
      if (o.bias && o.return_bias) {
        plan.extra_outputs_field = absl::StrCat(f, ".return_bias");
      } else if (o.input_layernorm && o.return_layernorm_output) {
        plan.extra_outputs_field = absl::StrCat(f, ".return_layernorm_output");
      }
      return plan;
    }
    case v1::LayerSpec::kTransformerLayer: {
      const std::string f = absl::StrCat(field, ".transformer_layer");
      ASSIGN_OR_RETURN(TransformerLayerOptions o, TransformerLayerOptionsFromSpec(layer.transformer_layer(), recipe, f));
      plan.in_width = plan.out_width = o.self_attention.hidden_size;
      plan.num_parameters = ParameterCount(o);
      plan.in_width_field = absl::StrCat(f, ".hidden_size");
      return plan;
    }
    case v1::LayerSpec::KIND_NOT_SET:
      break;
  }
  return InvalidField(field,
                      "one of linear, layer_norm, rms_norm, layer_norm_linear, layer_norm_mlp, dot_product_attention, "
                      "multihead_attention, transformer_layer, grouped_linear",
                      "no layer kind set");
}

absl::StatusOr<std::unique_ptr<Module>> MakeLayer(const v1::LayerSpec& layer, const std::string& name,
                                                  uint64_t seed, const recipes::Recipe& recipe) {
  if (layer.kind_case() == v1::LayerSpec::kLayerNormLinear) {
    ASSIGN_OR_RETURN(LayerNormLinearOptions options,
                     LayerNormLinearOptionsFromSpec(layer.layer_norm_linear(), recipe, "layer_norm_linear"));
    options.seed = seed;
    ASSIGN_OR_RETURN(std::unique_ptr<LayerNormLinear> fused, LayerNormLinear::Create(name, options, recipe));
    return std::unique_ptr<Module>(std::move(fused));
  }
  if (layer.kind_case() == v1::LayerSpec::kLayerNormMlp) {
    ASSIGN_OR_RETURN(LayerNormMLPOptions options,
                     LayerNormMLPOptionsFromSpec(layer.layer_norm_mlp(), recipe, "layer_norm_mlp"));
    options.seed = seed;
    ASSIGN_OR_RETURN(std::unique_ptr<LayerNormMLP> mlp, LayerNormMLP::Create(name, options, recipe));
    return std::unique_ptr<Module>(std::move(mlp));
  }
  if (layer.kind_case() == v1::LayerSpec::kMultiheadAttention) {
    ASSIGN_OR_RETURN(MultiheadAttentionOptions options,
                     MultiheadAttentionOptionsFromSpec(layer.multihead_attention(), recipe, "multihead_attention"));
    options.seed = seed;
    ASSIGN_OR_RETURN(std::unique_ptr<MultiheadAttention> attention, MultiheadAttention::Create(name, options, recipe));
    return std::unique_ptr<Module>(std::move(attention));
  }
  if (layer.kind_case() == v1::LayerSpec::kTransformerLayer) {
    ASSIGN_OR_RETURN(TransformerLayerOptions options,
                     TransformerLayerOptionsFromSpec(layer.transformer_layer(), recipe, "transformer_layer"));
    options.seed = seed;
    ASSIGN_OR_RETURN(std::unique_ptr<TransformerLayer> block, TransformerLayer::Create(name, options, recipe));
    return std::unique_ptr<Module>(std::move(block));
  }
  if (layer.kind_case() == v1::LayerSpec::kDotProductAttention) {
    ASSIGN_OR_RETURN(DotProductAttentionOptions options,
                     DotProductAttentionOptionsFromSpec(layer.dot_product_attention(), "dot_product_attention"));
    options.seed = seed;
    ASSIGN_OR_RETURN(std::unique_ptr<DotProductAttention> attention, DotProductAttention::Create(name, options));
    return std::unique_ptr<Module>(std::move(attention));
  }
  if (layer.kind_case() == v1::LayerSpec::kGroupedLinear) {
    const v1::GroupedLinearSpec& s = layer.grouped_linear();
    GroupedLinearOptions options;
    options.num_gemms = s.num_gemms();
    options.in_features = s.in_features();
    options.out_features = s.out_features();
    options.bias = s.has_bias() ? s.bias() : true;
    options.return_bias = s.return_bias();
    if (s.has_init_std()) options.init_std = s.init_std();
    options.seed = seed;
    ASSIGN_OR_RETURN(std::unique_ptr<GroupedLinear> grouped, GroupedLinear::Create(name, options, recipe));
    return std::unique_ptr<Module>(std::move(grouped));
  }
  if (layer.kind_case() == v1::LayerSpec::kLinear) {
    const v1::LinearSpec& s = layer.linear();
    LinearOptions options;
    options.in_features = s.in_features();
    options.out_features = s.out_features();
    options.bias = s.has_bias() ? s.bias() : true;
    options.return_bias = s.return_bias();
    if (s.has_init_std()) options.init_std = s.init_std();
    options.seed = seed;
    ASSIGN_OR_RETURN(std::unique_ptr<Linear> linear, Linear::Create(name, options, recipe));
    return std::unique_ptr<Module>(std::move(linear));
  }
  const bool ln = layer.kind_case() == v1::LayerSpec::kLayerNorm;
  NormOptions options;
  options.kind = ln ? NormKind::kLayerNorm : NormKind::kRmsNorm;
  options.hidden_size = ln ? layer.layer_norm().hidden_size() : layer.rms_norm().hidden_size();
  const bool has_eps = ln ? layer.layer_norm().has_eps() : layer.rms_norm().has_eps();
  if (has_eps) options.eps = ln ? layer.layer_norm().eps() : layer.rms_norm().eps();
  options.zero_centered_gamma =
      ln ? layer.layer_norm().zero_centered_gamma() : layer.rms_norm().zero_centered_gamma();
  ASSIGN_OR_RETURN(std::unique_ptr<Normalization> norm, Normalization::Create(name, options));
  return std::unique_ptr<Module>(std::move(norm));
}

}  // namespace

absl::StatusOr<std::unique_ptr<LayerStack>> BuildStack(const v1::ModelSpec& spec, const recipes::Recipe& recipe) {
  if (spec.layers_size() == 0) return InvalidField("model.layers", "at least one layer", "none");

  std::vector<LayerPlan> plans;
  absl::flat_hash_set<std::string> names;
  int64_t total_parameters = 0;
  for (int i = 0; i < spec.layers_size(); ++i) {
    const v1::LayerSpec& layer = spec.layers(i);
    const std::string field = absl::StrCat("model.layers[", i, "]");
    ASSIGN_OR_RETURN(LayerPlan plan, PlanLayer(layer, field, recipe));
    plan.name = layer.name().empty() ? absl::StrCat("layers.", i) : layer.name();
    if (!names.insert(plan.name).second) {
      return InvalidField(absl::StrCat(field, ".name"), "a name unique within the model",
                          absl::StrCat("'", plan.name, "' again"));
    }
    if (layer.kind_case() == v1::LayerSpec::kLinear && recipe.block_multiple() > 1) {
      const int64_t multiple = recipe.block_multiple();
      for (const auto& [dim, value] : {std::pair<const char*, int64_t>{"in_features", layer.linear().in_features()},
                                       {"out_features", layer.linear().out_features()}}) {
        if (value % multiple != 0) {
          return InvalidField(absl::StrCat(field, ".linear.", dim),
                              absl::StrCat("a multiple of ", multiple, " (", recipe.name(), " blocks must tile it)"),
                              value);
        }
      }
    }
    if (layer.kind_case() == v1::LayerSpec::kGroupedLinear && recipe.block_multiple() > 1) {
      const int64_t multiple = recipe.block_multiple();
      for (const auto& [dim, value] :
           {std::pair<const char*, int64_t>{"in_features", layer.grouped_linear().in_features()},
            {"out_features", layer.grouped_linear().out_features()}}) {
        if (value % multiple != 0) {
          return InvalidField(absl::StrCat(field, ".grouped_linear.", dim),
                              absl::StrCat("a multiple of ", multiple, " (", recipe.name(), " blocks must tile it)"),
                              value);
        }
      }
    }
    if (layer.kind_case() == v1::LayerSpec::kDotProductAttention) {
      RETURN_IF_ERROR(CheckDotProductAttentionPlace(layer.dot_product_attention(), i, spec.layers_size(), field));
    }
    if (!plan.extra_outputs_field.empty() && i + 1 != spec.layers_size()) {
      return InvalidField(plan.extra_outputs_field, "false (only the last layer of a stack may return extra outputs)",
                          "true");
    }
    if (!plans.empty() && plan.in_width != plans.back().out_width) {
      const std::string width_field = !plan.in_width_field.empty() ? plan.in_width_field
                                      : layer.kind_case() == v1::LayerSpec::kLinear
                                          ? absl::StrCat(field, ".linear.in_features")
                                          : absl::StrCat(field, layer.kind_case() == v1::LayerSpec::kLayerNorm
                                                                    ? ".layer_norm.hidden_size"
                                                                    : ".rms_norm.hidden_size");
      return InvalidField(width_field,
                          absl::StrCat(plans.back().out_width, " (the output width of layer '",
                                       plans.back().name, "')"),
                          plan.in_width);
    }
    if (layer.kind_case() == v1::LayerSpec::kGroupedLinear && layer.grouped_linear().return_bias() &&
        i + 1 != spec.layers_size()) {
      return InvalidField(absl::StrCat(field, ".grouped_linear.return_bias"),
                          "false (only the last layer of a stack may return its biases)", "true");
    }
    if (layer.kind_case() == v1::LayerSpec::kLinear && layer.linear().return_bias() &&
        i + 1 != spec.layers_size()) {
      return InvalidField(absl::StrCat(field, ".linear.return_bias"),
                          "false (only the last layer of a stack may return its bias)", "true");
    }
    total_parameters += plan.num_parameters;
    if (total_parameters > kMaxModelParameters) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "model: expected at most ", kMaxModelParameters, " parameters in total, got more than ",
          total_parameters, " by layer ", i));
    }
    plans.push_back(std::move(plan));
  }

  auto stack = std::make_unique<LayerStack>();
  for (int i = 0; i < spec.layers_size(); ++i) {
    ASSIGN_OR_RETURN(std::unique_ptr<Module> module,
                     MakeLayer(spec.layers(i), plans[i].name, DeriveSeed(spec.seed(), i), recipe));
    stack->Append(std::move(module));
  }
  return stack;
}

}  // namespace layers
}  // namespace teserve
