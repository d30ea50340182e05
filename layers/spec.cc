#include "layers/spec.h"

#include <string>
#include <type_traits>
#include <utility>
#include <vector>

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
#include "layers/spec_checks.h"
#include "layers/transformer_layer_spec.h"

namespace teserve {
namespace layers {
namespace {

// Most GEMMs one GroupedLinear may hold (each is a Linear with its own quantizers).
constexpr int64_t kMaxGemms = 4096;

// Input width -> output width of one layer, after checking its arguments.
struct LayerPlan {
  std::string name;
  int64_t in_width = 0;
  int64_t out_width = 0;
  int64_t num_parameters = 0;
  std::string in_width_field;       // the field a width mismatch names
  std::string extra_outputs_field;  // set: a flag adding outputs, allowed on the last layer only
  // Linear and GroupedLinear, checked once the layer's name is known: the GEMM
  // dimensions (field, value) the recipe's blocks must tile, and return_bias (set: the
  // field), allowed on the last layer only.
  std::vector<std::pair<std::string, int64_t>> tiled_dims;
  std::string return_bias_field;
  std::string return_bias_expected;
};

// The flag that adds outputs (return_bias first), or "" when neither is set.
std::string ExtraOutputsField(const std::string& f, bool return_bias, bool return_layernorm_output) {
  if (return_bias) return absl::StrCat(f, ".return_bias");
  if (return_layernorm_output) return absl::StrCat(f, ".return_layernorm_output");
  return "";
}

// Linear or GroupedLinear (LinearSpec / GroupedLinearSpec `s` under the field `f`).
template <typename Spec>
absl::StatusOr<LayerPlan> PlanLinear(const Spec& s, const std::string& f) {
  constexpr bool kGrouped = std::is_same_v<Spec, v1::GroupedLinearSpec>;
  int64_t num_gemms = 1;
  if constexpr (kGrouped) {
    if (s.num_gemms() < 1 || s.num_gemms() > kMaxGemms) {
      return InvalidField(absl::StrCat(f, ".num_gemms"), absl::StrCat("a count in 1..", kMaxGemms), s.num_gemms());
    }
    num_gemms = s.num_gemms();
  }
  RETURN_IF_ERROR(CheckSize(s.in_features(), absl::StrCat(f, ".in_features")));
  RETURN_IF_ERROR(CheckSize(s.out_features(), absl::StrCat(f, ".out_features")));
  RETURN_IF_ERROR(CheckInitStd(s.has_init_std(), s.init_std(), absl::StrCat(f, ".init_std")));
  LayerPlan plan;
  plan.in_width = s.in_features();
  plan.out_width = s.out_features();
  plan.num_parameters =
      num_gemms * (s.in_features() * s.out_features() + (s.has_bias() && !s.bias() ? 0 : s.out_features()));
  plan.in_width_field = absl::StrCat(f, ".in_features");
  plan.tiled_dims = {{absl::StrCat(f, ".in_features"), s.in_features()},
                     {absl::StrCat(f, ".out_features"), s.out_features()}};
  if (s.return_bias()) {
    plan.return_bias_field = absl::StrCat(f, ".return_bias");
    plan.return_bias_expected = absl::StrCat("false (only the last layer of a stack may return ",
                                             kGrouped ? "its biases" : "its bias", ")");
  }
  return plan;
}

// LayerSpec.params_dtype: unset (FP32), FLOAT32, BFLOAT16 or FLOAT16.
absl::StatusOr<DType> ParamsDType(const v1::LayerSpec& layer, absl::string_view field) {
  switch (layer.params_dtype()) {
    case v1::DTYPE_UNSPECIFIED:
    case v1::FLOAT32: return DType::kFloat32;
    case v1::BFLOAT16: return DType::kBFloat16;
    case v1::FLOAT16: return DType::kFloat16;
    default: break;
  }
  const std::string got = v1::DType_IsValid(layer.params_dtype())
                              ? v1::DType_Name(static_cast<v1::DType>(layer.params_dtype()))
                              : absl::StrCat(static_cast<int>(layer.params_dtype()));
  return InvalidField(absl::StrCat(field, ".params_dtype"), "FLOAT32, BFLOAT16 or FLOAT16", got);
}

absl::StatusOr<LayerPlan> PlanLayer(const v1::LayerSpec& layer, absl::string_view field,
                                    const recipes::Recipe& recipe) {
  RETURN_IF_ERROR(ParamsDType(layer, field).status());
  LayerPlan plan;
  switch (layer.kind_case()) {
    case v1::LayerSpec::kLinear:
      return PlanLinear(layer.linear(), absl::StrCat(field, ".linear"));
    case v1::LayerSpec::kGroupedLinear:
      return PlanLinear(layer.grouped_linear(), absl::StrCat(field, ".grouped_linear"));
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
      plan.num_parameters = NormParameterCount(ln ? NormKind::kLayerNorm : NormKind::kRmsNorm, hidden);
      plan.in_width_field = absl::StrCat(f, ".hidden_size");
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
      plan.extra_outputs_field = ExtraOutputsField(f, o.return_bias, o.return_layernorm_output);
      return plan;
    }
    case v1::LayerSpec::kLayerNormMlp: {
      const std::string f = absl::StrCat(field, ".layer_norm_mlp");
      ASSIGN_OR_RETURN(LayerNormMLPOptions o, LayerNormMLPOptionsFromSpec(layer.layer_norm_mlp(), recipe, f));
      plan.in_width = plan.out_width = o.hidden_size;
      plan.num_parameters = ParameterCount(o);
      plan.in_width_field = absl::StrCat(f, ".hidden_size");
      plan.extra_outputs_field = ExtraOutputsField(f, o.return_bias, o.return_layernorm_output);
      return plan;
    }
    case v1::LayerSpec::kMultiheadAttention: {
      const std::string f = absl::StrCat(field, ".multihead_attention");
      ASSIGN_OR_RETURN(MultiheadAttentionOptions o,
                       MultiheadAttentionOptionsFromSpec(layer.multihead_attention(), recipe, f));
      plan.in_width = plan.out_width = o.hidden_size;
      plan.num_parameters = ParameterCount(o);
      plan.in_width_field = absl::StrCat(f, ".hidden_size");
      // The layer ignores return_bias without a bias and return_layernorm_output without
      // input_layernorm.
      plan.extra_outputs_field = ExtraOutputsField(f, o.bias && o.return_bias,
                                                   o.input_layernorm && o.return_layernorm_output);
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

// Options fields LinearSpec and GroupedLinearSpec share.
template <typename Spec, typename Options>
Options LinearOptionsFromSpec(const Spec& s, Options o) {
  o.in_features = s.in_features();
  o.out_features = s.out_features();
  o.bias = s.has_bias() ? s.bias() : true;
  o.return_bias = s.return_bias();
  if (s.has_init_std()) o.init_std = s.init_std();
  return o;
}

// A layer from options its spec parser returned (already checked by PlanLayer), with
// the layer's seed.
template <typename Layer, typename Options>
absl::StatusOr<std::unique_ptr<Module>> CreateSeeded(absl::StatusOr<Options> options, const std::string& name,
                                                     uint64_t seed, const recipes::Recipe& recipe) {
  RETURN_IF_ERROR(options.status());
  options->seed = seed;
  return Layer::Create(name, *options, recipe);
}

// A LayerNorm or RMSNorm layer's options (checked by PlanLayer).
NormOptions NormOptionsFromSpec(const v1::LayerSpec& layer, DType params_dtype) {
  const bool ln = layer.kind_case() == v1::LayerSpec::kLayerNorm;
  NormOptions options;
  options.kind = ln ? NormKind::kLayerNorm : NormKind::kRmsNorm;
  options.hidden_size = ln ? layer.layer_norm().hidden_size() : layer.rms_norm().hidden_size();
  const bool has_eps = ln ? layer.layer_norm().has_eps() : layer.rms_norm().has_eps();
  if (has_eps) options.eps = ln ? layer.layer_norm().eps() : layer.rms_norm().eps();
  options.zero_centered_gamma = ln ? layer.layer_norm().zero_centered_gamma() : layer.rms_norm().zero_centered_gamma();
  options.params_dtype = params_dtype;
  return options;
}

// A GroupedLinear layer's options (checked by PlanLayer).
GroupedLinearOptions GroupedLinearOptionsFromSpec(const v1::GroupedLinearSpec& spec, DType params_dtype) {
  GroupedLinearOptions options = LinearOptionsFromSpec(spec, GroupedLinearOptions());
  options.num_gemms = spec.num_gemms();
  options.params_dtype = params_dtype;
  return options;
}

absl::StatusOr<std::unique_ptr<Module>> MakeFloat32Layer(const v1::LayerSpec& layer, const std::string& name,
                                                         uint64_t seed, const recipes::Recipe& recipe) {
  switch (layer.kind_case()) {
    case v1::LayerSpec::kLinear:
      return CreateSeeded<Linear, LinearOptions>(LinearOptionsFromSpec(layer.linear(), LinearOptions()), name, seed,
                                                 recipe);
    case v1::LayerSpec::kGroupedLinear:
      return CreateSeeded<GroupedLinear, GroupedLinearOptions>(
          GroupedLinearOptionsFromSpec(layer.grouped_linear(), DType::kFloat32), name, seed, recipe);
    case v1::LayerSpec::kLayerNormLinear:
      return CreateSeeded<LayerNormLinear>(
          LayerNormLinearOptionsFromSpec(layer.layer_norm_linear(), recipe, "layer_norm_linear"), name, seed, recipe);
    case v1::LayerSpec::kLayerNormMlp:
      return CreateSeeded<LayerNormMLP>(LayerNormMLPOptionsFromSpec(layer.layer_norm_mlp(), recipe, "layer_norm_mlp"),
                                        name, seed, recipe);
    case v1::LayerSpec::kMultiheadAttention:
      return CreateSeeded<MultiheadAttention>(
          MultiheadAttentionOptionsFromSpec(layer.multihead_attention(), recipe, "multihead_attention"), name, seed,
          recipe);
    case v1::LayerSpec::kTransformerLayer:
      return CreateSeeded<TransformerLayer>(
          TransformerLayerOptionsFromSpec(layer.transformer_layer(), recipe, "transformer_layer"), name, seed, recipe);
    case v1::LayerSpec::kDotProductAttention: {
      ASSIGN_OR_RETURN(DotProductAttentionOptions options,
                       DotProductAttentionOptionsFromSpec(layer.dot_product_attention(), "dot_product_attention"));
      options.seed = seed;
      return DotProductAttention::Create(name, options);
    }
    case v1::LayerSpec::kLayerNorm:
    case v1::LayerSpec::kRmsNorm:
      return Normalization::Create(name, NormOptionsFromSpec(layer, DType::kFloat32));
    case v1::LayerSpec::KIND_NOT_SET:
      break;
  }
  return absl::InternalError(absl::StrCat("layer ", Quoted(name), ": no layer kind set after planning"));
}

// The layer in its params_dtype: every layer computes in it natively (its activations
// in params_dtype, its master parameters and their gradients in FP32).
absl::StatusOr<std::unique_ptr<Module>> MakeLayer(const v1::LayerSpec& layer, const std::string& name,
                                                  uint64_t seed, const recipes::Recipe& recipe) {
  ASSIGN_OR_RETURN(const DType dtype, ParamsDType(layer, name));
  if (dtype == DType::kFloat32) return MakeFloat32Layer(layer, name, seed, recipe);
  switch (layer.kind_case()) {
    case v1::LayerSpec::kLinear: {
      LinearOptions options = LinearOptionsFromSpec(layer.linear(), LinearOptions());
      options.params_dtype = dtype;
      return CreateSeeded<Linear, LinearOptions>(options, name, seed, recipe);
    }
    case v1::LayerSpec::kLayerNorm:
    case v1::LayerSpec::kRmsNorm:
      return Normalization::Create(name, NormOptionsFromSpec(layer, dtype));
    case v1::LayerSpec::kLayerNormLinear: {
      ASSIGN_OR_RETURN(LayerNormLinearOptions options,
                       LayerNormLinearOptionsFromSpec(layer.layer_norm_linear(), recipe, "layer_norm_linear"));
      options.params_dtype = dtype;
      return CreateSeeded<LayerNormLinear, LayerNormLinearOptions>(options, name, seed, recipe);
    }
    case v1::LayerSpec::kDotProductAttention: {
      // q, k, v go to the attention kernels in params_dtype (cuDNN's fused SDPA where it
      // applies); the learnable softmax offset stays an FP32 parameter.
      ASSIGN_OR_RETURN(DotProductAttentionOptions options,
                       DotProductAttentionOptionsFromSpec(layer.dot_product_attention(), "dot_product_attention"));
      options.seed = seed;
      options.activation_dtype = dtype;
      return DotProductAttention::Create(name, options);
    }
    case v1::LayerSpec::kLayerNormMlp: {
      ASSIGN_OR_RETURN(LayerNormMLPOptions options,
                       LayerNormMLPOptionsFromSpec(layer.layer_norm_mlp(), recipe, "layer_norm_mlp"));
      options.params_dtype = dtype;
      return CreateSeeded<LayerNormMLP, LayerNormMLPOptions>(options, name, seed, recipe);
    }
    case v1::LayerSpec::kGroupedLinear:
      return CreateSeeded<GroupedLinear, GroupedLinearOptions>(GroupedLinearOptionsFromSpec(layer.grouped_linear(), dtype),
                                                               name, seed, recipe);
    case v1::LayerSpec::kMultiheadAttention: {
      // Every sub-layer in params_dtype (layers/multihead_attention.h), no boundary.
      ASSIGN_OR_RETURN(MultiheadAttentionOptions options,
                       MultiheadAttentionOptionsFromSpec(layer.multihead_attention(), recipe, "multihead_attention"));
      options.params_dtype = dtype;
      return CreateSeeded<MultiheadAttention, MultiheadAttentionOptions>(options, name, seed, recipe);
    }
    case v1::LayerSpec::kTransformerLayer: {
      // Its attention blocks, MLP and output layernorm in params_dtype
      // (layers/transformer_layer.h), no boundary.
      ASSIGN_OR_RETURN(TransformerLayerOptions options,
                       TransformerLayerOptionsFromSpec(layer.transformer_layer(), recipe, "transformer_layer"));
      options.params_dtype = dtype;
      return CreateSeeded<TransformerLayer, TransformerLayerOptions>(options, name, seed, recipe);
    }
    case v1::LayerSpec::KIND_NOT_SET:
      break;
  }
  return absl::InternalError(absl::StrCat("layer ", Quoted(name), ": no layer kind set after planning"));
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
                          absl::StrCat(Quoted(plan.name), " again"));
    }
    for (const auto& [dim_field, value] : plan.tiled_dims) RETURN_IF_ERROR(CheckTiles(value, recipe, dim_field));
    if (layer.kind_case() == v1::LayerSpec::kDotProductAttention) {
      RETURN_IF_ERROR(CheckDotProductAttentionPlace(layer.dot_product_attention(), i, spec.layers_size(), field));
    }
    if (!plan.extra_outputs_field.empty() && i + 1 != spec.layers_size()) {
      return InvalidField(plan.extra_outputs_field, "false (only the last layer of a stack may return extra outputs)",
                          "true");
    }
    if (!plans.empty() && plan.in_width != plans.back().out_width) {
      return InvalidField(plan.in_width_field,
                          absl::StrCat(plans.back().out_width, " (the output width of layer '",
                                       plans.back().name, "')"),
                          plan.in_width);
    }
    if (!plan.return_bias_field.empty() && i + 1 != spec.layers_size()) {
      return InvalidField(plan.return_bias_field, plan.return_bias_expected, "true");
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
