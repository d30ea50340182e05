#include "layers/layernorm_mlp.h"

#include <optional>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "kernels/cast.h"
#include "kernels/elementwise.h"
#include "layers/init.h"
#include "layers/layernorm_linear.h"
#include "layers/shape_check.h"

namespace teserve {
namespace layers {

using recipes::TensorRole;

struct LayerNormMLP::Saved : public SavedActivations {
  std::unique_ptr<SavedActivations> norm;
  std::unique_ptr<SavedActivations> fc1;
  std::unique_ptr<SavedActivations> fc2;
  Tensor fc1_out;  // [tokens, fc1_width] in params_dtype; undefined under checkpoint
  // checkpoint only: what the recomputation of fc1_out needs.
  Tensor input;
  FpropQuantization input_quantization;
  FpropQuantization weight_quantization;
};

absl::StatusOr<std::unique_ptr<LayerNormMLP>> LayerNormMLP::Create(std::string name,
                                                                   const LayerNormMLPOptions& options,
                                                                   const recipes::Recipe& recipe) {
  std::unique_ptr<LayerNormMLP> layer(new LayerNormMLP(name, options));
  ASSIGN_OR_RETURN(layer->norm_, CreateLayerNorm(name, options.normalization, options.hidden_size, options.eps,
                                                 options.zero_centered_gamma, options.params_dtype));
  LinearOptions fc1;
  fc1.in_features = options.hidden_size;
  fc1.out_features = layer->fc1_width();
  fc1.bias = options.bias;
  fc1.init_std = options.init_std;
  fc1.seed = DeriveSeed(options.seed, 1);
  fc1.weight_name = absl::StrCat(name, ".fc1_weight");
  fc1.bias_name = absl::StrCat(name, ".fc1_bias");
  fc1.params_dtype = options.params_dtype;
  ASSIGN_OR_RETURN(layer->fc1_, Linear::Create(absl::StrCat(name, ".fc1"), fc1, recipe));
  // gelu with 16-bit params and no quantization: fc1's GEMM applies it in its epilogue.
  if (options.activation == kernels::Activation::kGelu && options.bias && options.params_dtype != DType::kFloat32 &&
      layer->fc1_->Quantizers().empty()) {
    RETURN_IF_ERROR(layer->fc1_->set_fprop_gelu(true));
    layer->gelu_epilogue_ = true;
  }
  LinearOptions fc2;
  fc2.in_features = options.ffn_hidden_size;
  fc2.out_features = options.hidden_size;
  fc2.bias = options.bias;
  fc2.return_bias = options.return_bias;
  fc2.init_std = options.init_std;
  fc2.seed = DeriveSeed(options.seed, 2);
  fc2.weight_name = absl::StrCat(name, ".fc2_weight");
  fc2.bias_name = absl::StrCat(name, ".fc2_bias");
  fc2.params_dtype = options.params_dtype;
  ASSIGN_OR_RETURN(layer->fc2_, Linear::Create(absl::StrCat(name, ".fc2"), fc2, recipe));
  if (options.checkpoint && recipe.quantizes()) {
    ASSIGN_OR_RETURN(layer->replay_input_, recipes::MakeQuantizer(recipe, TensorRole::kInput));
    ASSIGN_OR_RETURN(layer->replay_weight_, recipes::MakeQuantizer(recipe, TensorRole::kWeight));
  }
  return layer;
}

absl::StatusOr<std::vector<Shape>> LayerNormMLP::OutputShapes(const std::vector<Shape>& input_shapes,
                                                              absl::string_view field) const {
  RETURN_IF_ERROR(ExpectInputCount(input_shapes, 1, field));
  RETURN_IF_ERROR(ExpectFeatures(input_shapes[0], options_.hidden_size, absl::StrCat(field, "[0]"),
                                 absl::StrCat("hidden_size of layer ", Quoted(name()))));
  // fc1 checks the token count against the recipe's block size; fc2 sees the same rows.
  RETURN_IF_ERROR(fc1_->OutputShapes(input_shapes, field).status());
  std::vector<Shape> shapes{input_shapes[0]};
  if (returns_bias()) shapes.push_back({options_.hidden_size});
  if (options_.return_layernorm_output) shapes.push_back(input_shapes[0]);
  return shapes;
}

LayerNormMLP::FpropQuantization LayerNormMLP::Record(TensorRole role) const {
  FpropQuantization how;
  if (replay_input_ == nullptr) return how;  // not checkpointing a quantizing recipe
  for (const NamedQuantizer& q : fc1_->Quantizers()) {
    if (q.quantizer->role() != role) continue;
    how.quantized = true;
    how.per_tensor = q.quantizer->mode() == ScalingMode::kPerTensor;
    how.format = q.quantizer->format();
    // Delayed: the scale in use until the region ends (unlike a Snapshot this leaves this
    // region's amaxes on the device: no wait mid-forward); current: its rule.
    how.scale = q.quantizer->ScaleInUse();
    how.current = q.quantizer->current_rule();
  }
  return how;
}

absl::StatusOr<QuantizedTensor> LayerNormMLP::Requantize(const Context& ctx, const FpropQuantization& how,
                                                         recipes::Quantizer* replay, const Tensor& x) const {
  if (how.per_tensor) {
    // What a per-tensor quantizer reads (recipes::Quantizer): FP32 or BF16 as they are,
    // FP16 as its exact FP32 value; either way x's values, so the same codes.
    Tensor source = x;
    if (x.dtype() != DType::kFloat32 && x.dtype() != DType::kBFloat16) {
      ASSIGN_OR_RETURN(source, kernels::Convert(ctx, x, DType::kFloat32));
    }
    kernels::PerTensorQuantizeOptions options;
    options.format = how.format;
    options.scale = how.scale;
    options.current = how.current;
    options.rowwise = true;
    options.columnwise = false;
    return kernels::QuantizePerTensor(ctx, source, options);
  }
  // Both copies, as fc1's saving forward requested them: NVFP4 derives one global scale
  // from x and its transformed columnwise copy, so the rowwise copy depends on it.
  ASSIGN_OR_RETURN(QuantizedTensor q, replay->Quantize(ctx, x, /*rowwise=*/true, /*columnwise=*/true));
  // The replay quantizer is in no region the session ends: its amax (left on the device
  // by block recipes) is read now, asynchronously, instead of piling up.
  replay->EndRegion();
  return q;
}

absl::StatusOr<Tensor> LayerNormMLP::RecomputeFc1(const Context& ctx, const Saved& saved) const {
  ForwardOptions no_save;
  no_save.save_for_backward = false;
  const FpropQuantization& input = saved.input_quantization;
  Tensor ln_out;
  QuantizedTensor x_q, w_q;
  if (input.fused_mode.has_value()) {
    // The forward's fused cast again: the same FP32 norm output, mode, format and scale
    // (only the rowwise copy, which the columnwise one does not change in these modes).
    recipes::FusedCast cast;
    cast.mode = *input.fused_mode;
    cast.format = input.format;
    cast.scale = input.scale;
    RETURN_IF_ERROR(
        norm_->ForwardFused(ctx, {saved.input}, no_save, cast, /*columnwise=*/false, /*write_y=*/false, &x_q).status());
  } else {
    ASSIGN_OR_RETURN(ForwardOutput normed, norm_->Forward(ctx, {saved.input}, no_save));
    ASSIGN_OR_RETURN(ln_out, normed.outputs[0].As2D());
    if (input.quantized) {
      ASSIGN_OR_RETURN(x_q, Requantize(ctx, input, replay_input_.get(), ln_out));
    }
  }
  ASSIGN_OR_RETURN(const Tensor w1, fc1_->GemmWeight(ctx));
  if (saved.weight_quantization.quantized) {
    ASSIGN_OR_RETURN(w_q, Requantize(ctx, saved.weight_quantization, replay_weight_.get(), w1));
  }
  if (gelu_epilogue_) {
    // The forward's epilogue GEMM again; the backward reads its pre-activation.
    Tensor pre_activation;
    RETURN_IF_ERROR(fc1_->Fprop(ctx, ln_out, nullptr, w1, nullptr, &pre_activation).status());
    return pre_activation;
  }
  return fc1_->Fprop(ctx, ln_out, input.quantized ? &x_q : nullptr, w1,
                     saved.weight_quantization.quantized ? &w_q : nullptr);
}

absl::StatusOr<ForwardOutput> LayerNormMLP::Forward(const Context& ctx, const std::vector<Tensor>& inputs,
                                                    const ForwardOptions& options) {
  ASSIGN_OR_RETURN(NormThenLinearOutput run,
                   NormThenLinear(ctx, *norm_, *fc1_, inputs, options, options_.return_layernorm_output));
  ForwardOutput& normed = run.normed;
  ForwardOutput& fc1 = run.projected;
  Shape act_shape = inputs[0].shape();
  act_shape.back() = options_.ffn_hidden_size;
  if (gelu_epilogue_) {
    // fc1's epilogue applied gelu: its first output is the activation, its last the
    // pre-activation (fc1_out, which the backward reads).
    ASSIGN_OR_RETURN(Tensor fc1_out, fc1.outputs.back().As2D());
    ASSIGN_OR_RETURN(ForwardOutput fc2, fc2_->Forward(ctx, {fc1.outputs[0]}, options));
    return Finish(std::move(normed), std::move(fc1), std::move(fc2), fc1_out, inputs[0], run.fused, options);
  }
  ASSIGN_OR_RETURN(Tensor fc1_out, fc1.outputs[0].As2D());
  // The activation reads fc1_out in params_dtype and writes in it (FP32 math). Under a
  // per-tensor plan of fc2's input quantizer the activation kernel writes fc2's FP8
  // operand instead (the FP32 values cast as the quantizer would cast them): the
  // backward reads fc1_out, not the activation, so the 16-bit copy is not needed.
  kernels::ActivationForwardOptions act_options;
  act_options.y_dtype = options_.params_dtype;
  std::optional<recipes::FusedCast> cast = fc2_->PlanInputCast(fc1_out.dim(0), options);
  if (cast.has_value() && cast->mode == ScalingMode::kPerTensor) {
    act_options.write_y = false;
    act_options.quantize = true;
    act_options.quantize_options.format = cast->format;
    act_options.quantize_options.scale = cast->scale;
    act_options.quantize_options.rowwise = true;
    act_options.quantize_options.columnwise = options.save_for_backward;
    act_options.quantize_options.defer_amax = cast->defer_amax;
  }
  ASSIGN_OR_RETURN(kernels::ActivationForwardResult activated,
                   kernels::FusedActivationForward(ctx, options_.activation, options_.activation_params, fc1_out,
                                                   act_options));
  ForwardOutput fc2;
  if (act_options.quantize) {
    ASSIGN_OR_RETURN(fc2, fc2_->ForwardQuantizedInput(ctx, std::move(activated.fp8), act_shape,
                                                      options_.params_dtype, options));
  } else {
    ASSIGN_OR_RETURN(Tensor act, activated.y.Reshape(act_shape));
    ASSIGN_OR_RETURN(fc2, fc2_->Forward(ctx, {act}, options));
  }
  return Finish(std::move(normed), std::move(fc1), std::move(fc2), fc1_out, inputs[0], run.fused, options);
}

absl::StatusOr<ForwardOutput> LayerNormMLP::Finish(ForwardOutput normed, ForwardOutput fc1, ForwardOutput fc2,
                                                   const Tensor& fc1_out, const Tensor& input,
                                                   const std::optional<recipes::FusedCast>& fused,
                                                   const ForwardOptions& options) {
  ForwardOutput out;
  out.outputs = std::move(fc2.outputs);
  if (options_.return_layernorm_output) out.outputs.push_back(normed.outputs[0]);
  if (options.save_for_backward) {
    auto saved = std::make_unique<Saved>();
    saved->norm = std::move(normed.saved);
    saved->fc1 = std::move(fc1.saved);
    saved->fc2 = std::move(fc2.saved);
    if (options_.checkpoint) {
      saved->input = input;
      saved->input_quantization = Record(TensorRole::kInput);
      if (fused.has_value()) saved->input_quantization.fused_mode = fused->mode;
      saved->weight_quantization = Record(TensorRole::kWeight);
    } else {
      saved->fc1_out = fc1_out;
    }
    out.saved = std::move(saved);
  }
  return out;
}

absl::StatusOr<std::vector<Tensor>> LayerNormMLP::Backward(const Context& ctx, SavedActivations& saved_base,
                                                           const std::vector<Tensor>& grad_outputs,
                                                           SideGrads* side_grads) {
  auto& saved = static_cast<Saved&>(saved_base);
  std::vector<Tensor> fc2_grads{grad_outputs[0]};
  if (returns_bias()) fc2_grads.push_back(grad_outputs[1]);
  std::vector<Tensor> d_ln;
  if (gelu_epilogue_) {
    // fc2's dgrad GEMM applies gelu' in its epilogue and sums fc1's bias gradient.
    Tensor fc1_out = saved.fc1_out;
    if (options_.checkpoint) {
      ASSIGN_OR_RETURN(fc1_out, RecomputeFc1(ctx, saved));
    }
    Tensor fc1_bias_grad;
    ASSIGN_OR_RETURN(const Tensor d_fc1,
                     fc2_->BackwardThroughGelu(ctx, *saved.fc2, fc2_grads, fc1_out, &fc1_bias_grad));
    ASSIGN_OR_RETURN(d_ln, fc1_->BackwardWithBiasGrad(ctx, *saved.fc1, {d_fc1}, fc1_bias_grad));
    return FinishBackward(ctx, saved, grad_outputs, std::move(d_ln));
  }
  ASSIGN_OR_RETURN(std::vector<Tensor> d_act, fc2_->Backward(ctx, *saved.fc2, fc2_grads));
  ASSIGN_OR_RETURN(Tensor d_act_2d, d_act[0].As2D());

  Tensor fc1_out = saved.fc1_out;
  if (options_.checkpoint) {
    ASSIGN_OR_RETURN(fc1_out, RecomputeFc1(ctx, saved));
  }
  // d_act comes from fc2's backward in the dtype fc2 read (params_dtype, fc1_out's).
  ASSIGN_OR_RETURN(const Tensor dy_act, kernels::Convert(ctx, d_act_2d, fc1_out.dtype()));
  ASSIGN_OR_RETURN(kernels::ActivationBackwardResult d_fc1,
                   kernels::FusedActivationBackward(ctx, options_.activation, options_.activation_params, dy_act,
                                                    fc1_out, kernels::ActivationBackwardOptions()));
  ASSIGN_OR_RETURN(d_ln, fc1_->Backward(ctx, *saved.fc1, {d_fc1.dx}));
  return FinishBackward(ctx, saved, grad_outputs, std::move(d_ln));
}

absl::StatusOr<std::vector<Tensor>> LayerNormMLP::FinishBackward(const Context& ctx, Saved& saved,
                                                                 const std::vector<Tensor>& grad_outputs,
                                                                 std::vector<Tensor> d_ln) {
  // The returned ln_out's gradient joins in FP32 (d_ln[0] is in params_dtype; the norm's
  // backward takes any dtype). For FP32 d_ln[0] is a fresh tensor of Linear's, added to
  // in place.
  if (options_.return_layernorm_output) {
    ASSIGN_OR_RETURN(d_ln[0], kernels::Convert(ctx, d_ln[0], DType::kFloat32));
    ASSIGN_OR_RETURN(const Tensor ln_out_grad, kernels::Convert(ctx, grad_outputs.back(), DType::kFloat32));
    RETURN_IF_ERROR(kernels::AddInto(ctx, ln_out_grad, &d_ln[0]));
  }
  return norm_->Backward(ctx, *saved.norm, d_ln);
}

std::vector<Parameter*> LayerNormMLP::Parameters() {
  std::vector<Parameter*> params = norm_->Parameters();
  for (Parameter* p : fc1_->Parameters()) params.push_back(p);
  for (Parameter* p : fc2_->Parameters()) params.push_back(p);
  return params;
}

std::vector<NamedQuantizer> LayerNormMLP::Quantizers() {
  std::vector<NamedQuantizer> out = fc1_->Quantizers();
  for (const NamedQuantizer& q : fc2_->Quantizers()) out.push_back(q);
  return out;
}

}  // namespace layers
}  // namespace teserve
