#include "layers/layernorm_linear.h"

#include <optional>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "core/status.h"
#include "kernels/elementwise.h"
#include "layers/shape_check.h"

namespace teserve {
namespace layers {
namespace {

struct LayerNormLinearSaved : public SavedActivations {
  std::unique_ptr<SavedActivations> norm;
  std::unique_ptr<SavedActivations> linear;
};

absl::string_view SplitName(absl::string_view name) {
  while (absl::ConsumeSuffix(&name, "_")) {
  }
  return name;
}

}  // namespace

absl::Status ValidateParametersSplit(const ParametersSplit& split, int64_t out_features, absl::string_view field) {
  absl::flat_hash_set<absl::string_view> names;
  int64_t total = 0;
  for (size_t i = 0; i < split.size(); ++i) {
    const absl::string_view name = SplitName(split[i].first);
    const std::string at = absl::StrCat(field, "[", i, "]");
    if (name.empty()) {
      return InvalidField(absl::StrCat(at, ".name"), "a non-empty name (trailing underscores are dropped)",
                          Quoted(split[i].first));
    }
    if (!names.insert(name).second) {
      return InvalidField(absl::StrCat(at, ".name"), "a name unique within parameters_split",
                          absl::StrCat(Quoted(name), " again"));
    }
    if (split[i].second <= 0 || split[i].second > out_features) {
      return InvalidField(absl::StrCat(at, ".size"), absl::StrCat("a size in 1..", out_features, " (out_features)"),
                          split[i].second);
    }
    total += split[i].second;
  }
  if (!split.empty() && total != out_features) {
    return InvalidField(field, absl::StrCat("sizes summing to out_features ", out_features), total);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Normalization>> CreateLayerNorm(const std::string& layer, NormKind kind,
                                                               int64_t hidden_size, float eps,
                                                               bool zero_centered_gamma, DType params_dtype) {
  NormOptions options;
  options.params_dtype = params_dtype;
  options.kind = kind;
  options.hidden_size = hidden_size;
  options.eps = eps;
  options.zero_centered_gamma = zero_centered_gamma;
  ASSIGN_OR_RETURN(std::unique_ptr<Normalization> norm, Normalization::Create(layer, options));
  // Normalization names its parameters gamma, beta (in that order) "<name>.weight",
  // "<name>.bias"; inside a fused layer TE calls them layer_norm_weight / _bias.
  std::vector<Parameter*> params = norm->Parameters();
  params[0]->name = absl::StrCat(layer, ".layer_norm_weight");
  if (params.size() > 1) params[1]->name = absl::StrCat(layer, ".layer_norm_bias");
  return norm;
}

absl::StatusOr<NormThenLinearOutput> NormThenLinear(const Context& ctx, Normalization& norm, Linear& linear,
                                                    const std::vector<Tensor>& inputs, const ForwardOptions& options,
                                                    bool write_y) {
  const Shape& shape = inputs[0].shape();
  const int64_t rows = shape.empty() || shape.back() == 0 ? 0 : inputs[0].numel() / shape.back();
  NormThenLinearOutput out;
  out.fused = linear.PlanInputCast(rows, options);
  if (out.fused.has_value()) {
    QuantizedTensor x_q;
    ASSIGN_OR_RETURN(out.normed,
                     norm.ForwardFused(ctx, inputs, options, *out.fused, options.save_for_backward, write_y, &x_q));
    ASSIGN_OR_RETURN(out.projected,
                     linear.ForwardQuantizedInput(ctx, std::move(x_q), shape, linear.params_dtype(), options));
    return out;
  }
  ASSIGN_OR_RETURN(out.normed, norm.Forward(ctx, inputs, options));
  ASSIGN_OR_RETURN(out.projected, linear.Forward(ctx, {out.normed.outputs[0]}, options));
  return out;
}

absl::StatusOr<std::unique_ptr<LayerNormLinear>> LayerNormLinear::Create(std::string name,
                                                                         const LayerNormLinearOptions& options,
                                                                         const recipes::Recipe& recipe) {
  RETURN_IF_ERROR(ValidateParametersSplit(options.parameters_split, options.out_features, "parameters_split"));
  std::unique_ptr<LayerNormLinear> layer(new LayerNormLinear(name, options));
  ASSIGN_OR_RETURN(layer->norm_, CreateLayerNorm(name, options.normalization, options.in_features, options.eps,
                                                 options.zero_centered_gamma, options.params_dtype));
  LinearOptions linear;
  linear.in_features = options.in_features;
  linear.out_features = options.out_features;
  linear.bias = options.bias;
  linear.return_bias = options.return_bias;
  linear.init_std = options.init_std;
  linear.seed = options.seed;
  linear.params_dtype = options.params_dtype;
  ASSIGN_OR_RETURN(layer->linear_, Linear::Create(name, linear, recipe));

  if (!options.parameters_split.empty()) {
    std::vector<Parameter*> whole = layer->linear_->Parameters();  // weight, [bias]
    int64_t begin = 0;
    for (const auto& [split_name, rows] : options.parameters_split) {
      const absl::string_view stem = SplitName(split_name);
      layer->split_weights_.push_back(RowBlock(*whole[0], absl::StrCat(name, ".", stem, "_weight"), begin, rows));
      if (options.bias) {
        layer->split_biases_.push_back(RowBlock(*whole[1], absl::StrCat(name, ".", stem, "_bias"), begin, rows));
      }
      begin += rows;
    }
  }
  return layer;
}

absl::StatusOr<std::vector<Shape>> LayerNormLinear::OutputShapes(const std::vector<Shape>& input_shapes,
                                                                 absl::string_view field) const {
  RETURN_IF_ERROR(ExpectInputCount(input_shapes, 1, field));
  RETURN_IF_ERROR(ExpectFeatures(input_shapes[0], options_.in_features, absl::StrCat(field, "[0]"),
                                 absl::StrCat("in_features of layer ", Quoted(name()))));
  ASSIGN_OR_RETURN(std::vector<Shape> shapes, linear_->OutputShapes(input_shapes, field));
  if (options_.return_layernorm_output) shapes.push_back(input_shapes[0]);
  return shapes;
}

absl::StatusOr<ForwardOutput> LayerNormLinear::Forward(const Context& ctx, const std::vector<Tensor>& inputs,
                                                       const ForwardOptions& options) {
  ASSIGN_OR_RETURN(NormThenLinearOutput run,
                   NormThenLinear(ctx, *norm_, *linear_, inputs, options, options_.return_layernorm_output));
  ForwardOutput& normed = run.normed;
  ForwardOutput& projected = run.projected;
  ForwardOutput out;
  out.outputs = std::move(projected.outputs);
  if (options_.return_layernorm_output) out.outputs.push_back(normed.outputs[0]);
  if (options.save_for_backward) {
    auto saved = std::make_unique<LayerNormLinearSaved>();
    saved->norm = std::move(normed.saved);
    saved->linear = std::move(projected.saved);
    out.saved = std::move(saved);
  }
  return out;
}

absl::StatusOr<std::vector<Tensor>> LayerNormLinear::Backward(const Context& ctx, SavedActivations& saved_base,
                                                              const std::vector<Tensor>& grad_outputs,
                                                              SideGrads* side_grads) {
  auto& saved = static_cast<LayerNormLinearSaved&>(saved_base);
  std::vector<Tensor> linear_grads{grad_outputs[0]};
  if (returns_bias()) linear_grads.push_back(grad_outputs[1]);
  ASSIGN_OR_RETURN(std::vector<Tensor> d_ln, linear_->Backward(ctx, *saved.linear, linear_grads));
  // d_ln[0] is a fresh tensor of Linear's, so the returned ln_out's gradient can be
  // added in place (in FP32: a 16-bit params_dtype hands a 16-bit d_ln over, and the
  // norm's backward takes any dtype).
  if (options_.return_layernorm_output) {
    ASSIGN_OR_RETURN(d_ln[0], kernels::Convert(ctx, d_ln[0], DType::kFloat32));
    ASSIGN_OR_RETURN(const Tensor ln_out_grad, kernels::Convert(ctx, grad_outputs.back(), DType::kFloat32));
    RETURN_IF_ERROR(kernels::AddInto(ctx, ln_out_grad, &d_ln[0]));
  }
  return norm_->Backward(ctx, *saved.norm, d_ln);
}

std::vector<Parameter*> LayerNormLinear::Parameters() {
  std::vector<Parameter*> params = norm_->Parameters();
  if (options_.parameters_split.empty()) {
    for (Parameter* p : linear_->Parameters()) params.push_back(p);
    return params;
  }
  for (Parameter& p : split_weights_) params.push_back(&p);
  for (Parameter& p : split_biases_) params.push_back(&p);
  return params;
}

std::vector<NamedQuantizer> LayerNormLinear::Quantizers() { return linear_->Quantizers(); }

}  // namespace layers
}  // namespace teserve
