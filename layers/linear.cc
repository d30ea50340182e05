#include "layers/linear.h"

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "kernels/cast.h"
#include "kernels/gemm.h"
#include "layers/init.h"
#include "layers/shape_check.h"

namespace teserve {
namespace layers {
namespace {

using kernels::Copy;
using recipes::TensorRole;

// A GEMM operand as saved by the forward: either the FP32 tensor or its quantized
// copies (which is what a quantized backward must use).
struct SavedOperand {
  Tensor value;            // FP32, when not quantized
  QuantizedTensor quantized;
  bool is_quantized = false;

  // The copy a GEMM reads: rowwise [rows, cols] or columnwise [cols, rows].
  absl::StatusOr<Tensor> Read(const Context& ctx, Copy copy) const {
    if (!is_quantized) return value;
    return recipes::DequantizeCopy(ctx, quantized, copy);
  }
};

struct LinearSaved : public SavedActivations {
  Shape input_shape;
  SavedOperand x;  // [N, in]
  SavedOperand w;  // [out, in]
};

// Quantizes `x` with `quantizer` when there is one; returns the fprop (rowwise) operand
// and fills `saved` with what the backward needs.
// Under calibration the quantizer only observes the amax and x stays FP32.
absl::StatusOr<Tensor> PrepareOperand(const Context& ctx, recipes::Quantizer* quantizer, bool calibrating,
                                      const Tensor& x, bool save_for_backward, SavedOperand* saved) {
  if (quantizer == nullptr || calibrating) {
    if (quantizer != nullptr) RETURN_IF_ERROR(quantizer->Observe(ctx, x));
    if (saved != nullptr) saved->value = x;
    return x;
  }
  ASSIGN_OR_RETURN(QuantizedTensor q, quantizer->Quantize(ctx, x, /*rowwise=*/true,
                                                          /*columnwise=*/save_for_backward));
  ASSIGN_OR_RETURN(Tensor rowwise, recipes::DequantizeCopy(ctx, q, Copy::kRowwise));
  if (saved != nullptr) {
    q.rowwise_data = Tensor();  // the backward reads only the columnwise copy
    saved->quantized = std::move(q);
    saved->is_quantized = true;
  }
  return rowwise;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Linear>> Linear::Create(std::string name, const LinearOptions& options,
                                                       const recipes::Recipe& recipe) {
  std::unique_ptr<Linear> layer(new Linear(name, options));
  ASSIGN_OR_RETURN(layer->weight_.value,
                   Tensor::Zeros(DType::kFloat32, {options.out_features, options.in_features}));
  ASSIGN_OR_RETURN(layer->weight_.grad,
                   Tensor::Zeros(DType::kFloat32, {options.out_features, options.in_features}));
  layer->weight_.name = options.weight_name.empty() ? absl::StrCat(name, ".weight") : options.weight_name;
  FillNormal(options.seed, options.init_std, layer->weight_.value.mutable_floats());
  if (options.bias) {
    ASSIGN_OR_RETURN(layer->bias_.value, Tensor::Zeros(DType::kFloat32, {options.out_features}));
    ASSIGN_OR_RETURN(layer->bias_.grad, Tensor::Zeros(DType::kFloat32, {options.out_features}));
    layer->bias_.name = options.bias_name.empty() ? absl::StrCat(name, ".bias") : options.bias_name;
  }
  ASSIGN_OR_RETURN(layer->input_quantizer_, recipes::MakeQuantizer(recipe, TensorRole::kInput));
  ASSIGN_OR_RETURN(layer->weight_quantizer_, recipes::MakeQuantizer(recipe, TensorRole::kWeight));
  ASSIGN_OR_RETURN(layer->grad_output_quantizer_, recipes::MakeQuantizer(recipe, TensorRole::kGradOutput));
  layer->calibrating_ = recipe.calibrating;
  layer->row_multiple_ = recipe.block_multiple();
  return layer;
}

absl::StatusOr<std::vector<Shape>> Linear::OutputShapes(const std::vector<Shape>& input_shapes,
                                                        absl::string_view field) const {
  RETURN_IF_ERROR(ExpectInputCount(input_shapes, 1, field));
  RETURN_IF_ERROR(ExpectFeatures(input_shapes[0], options_.in_features, absl::StrCat(field, "[0]"),
                                 absl::StrCat("in_features of layer '", name(), "'")));
  Shape out = input_shapes[0];
  int64_t rows = 1;  // tokens: the product of the leading dimensions
  for (size_t i = 0; i + 1 < out.size(); ++i) rows *= out[i];
  if (rows % row_multiple_ != 0) {
    return InvalidField(absl::StrCat(field, "[0].shape"),
                        absl::StrCat("a token count (product of the leading dimensions) divisible by ", row_multiple_,
                                     " (the recipe's block size, for layer '", name(), "')"),
                        absl::StrCat(rows, " in ", ShapeToString(out)));
  }
  out.back() = options_.out_features;
  if (options_.bias && options_.return_bias) return std::vector<Shape>{out, {options_.out_features}};
  return std::vector<Shape>{out};
}

absl::StatusOr<ForwardOutput> Linear::Forward(const Context& ctx, const std::vector<Tensor>& inputs,
                                              const ForwardOptions& options) {
  ASSIGN_OR_RETURN(Tensor x, inputs[0].As2D());
  std::unique_ptr<LinearSaved> saved;
  if (options.save_for_backward) {
    saved = std::make_unique<LinearSaved>();
    saved->input_shape = inputs[0].shape();
  }
  ASSIGN_OR_RETURN(Tensor x_fprop, PrepareOperand(ctx, input_quantizer_.get(), calibrating_, x, options.save_for_backward,
                                                  saved ? &saved->x : nullptr));
  ASSIGN_OR_RETURN(Tensor w_fprop, PrepareOperand(ctx, weight_quantizer_.get(), calibrating_, weight_.value,
                                                  options.save_for_backward, saved ? &saved->w : nullptr));

  // Every output lives on the Context's device, ordered on its stream; the GEMM (beta 0)
  // writes every element, so no zero fill.
  ASSIGN_OR_RETURN(Tensor y, Tensor::Empty(DType::kFloat32, {x.dim(0), options_.out_features}, ctx.device, ctx.stream));
  RETURN_IF_ERROR(kernels::Gemm(ctx, x_fprop, false, w_fprop, true, 1.0f, 0.0f, &y));

  ForwardOutput out;
  if (options_.bias && !options_.return_bias) RETURN_IF_ERROR(kernels::AddBias(ctx, bias_.value, &y));
  Shape y_shape = inputs[0].shape();
  y_shape.back() = options_.out_features;
  ASSIGN_OR_RETURN(Tensor y_full, y.Reshape(y_shape));
  out.outputs.push_back(std::move(y_full));
  if (options_.bias && options_.return_bias) {
    ASSIGN_OR_RETURN(Tensor bias_copy, bias_.value.Clone(ctx.stream));
    out.outputs.push_back(std::move(bias_copy));
  }
  out.saved = std::move(saved);
  return out;
}

absl::StatusOr<std::vector<Tensor>> Linear::Backward(const Context& ctx, SavedActivations& saved_base,
                                                     const std::vector<Tensor>& grad_outputs,
                                                     SideGrads* side_grads) {
  auto& saved = static_cast<LinearSaved&>(saved_base);
  ASSIGN_OR_RETURN(Tensor dy, grad_outputs[0].As2D());

  if (options_.bias) {
    if (options_.return_bias) {
      // The bias was returned, not added: its gradient arrives as the second output's.
      ASSIGN_OR_RETURN(Tensor dbias, grad_outputs[1].Reshape({1, options_.out_features}));
      RETURN_IF_ERROR(kernels::ColumnSum(ctx, dbias, /*accumulate=*/true, &bias_.grad));
    } else {
      RETURN_IF_ERROR(kernels::ColumnSum(ctx, dy, /*accumulate=*/true, &bias_.grad));
    }
  }

  // dy for dgrad (rowwise [N, out]) and wgrad (columnwise [out, N] when quantized).
  SavedOperand dy_operand;
  dy_operand.value = dy;
  if (grad_output_quantizer_ != nullptr && calibrating_) {
    RETURN_IF_ERROR(grad_output_quantizer_->Observe(ctx, dy));
  } else if (grad_output_quantizer_ != nullptr) {
    ASSIGN_OR_RETURN(dy_operand.quantized, grad_output_quantizer_->Quantize(ctx, dy, true, true));
    dy_operand.is_quantized = true;
  }
  ASSIGN_OR_RETURN(Tensor dy_dgrad, dy_operand.Read(ctx, Copy::kRowwise));
  ASSIGN_OR_RETURN(Tensor dy_wgrad, dy_operand.Read(ctx, Copy::kColumnwise));
  ASSIGN_OR_RETURN(Tensor w_dgrad, saved.w.Read(ctx, Copy::kColumnwise));
  ASSIGN_OR_RETURN(Tensor x_wgrad, saved.x.Read(ctx, Copy::kColumnwise));

  // dgrad: dx [N, in] = dy [N, out] x W [out, in]; the columnwise W is W^T [in, out].
  ASSIGN_OR_RETURN(Tensor dx, Tensor::Empty(DType::kFloat32, {dy.dim(0), options_.in_features}, ctx.device, ctx.stream));
  RETURN_IF_ERROR(kernels::Gemm(ctx, dy_dgrad, false, w_dgrad, saved.w.is_quantized, 1.0f, 0.0f, &dx));

  // wgrad: dW [out, in] += dy^T [out, N] x x [N, in]; columnwise copies are already
  // transposed ([out, N] and [in, N]).
  RETURN_IF_ERROR(kernels::Gemm(ctx, dy_wgrad, !dy_operand.is_quantized, x_wgrad, saved.x.is_quantized,
                                1.0f, 1.0f, &weight_.grad));

  ASSIGN_OR_RETURN(Tensor dx_full, dx.Reshape(saved.input_shape));
  return std::vector<Tensor>{std::move(dx_full)};
}

std::vector<Parameter*> Linear::Parameters() {
  std::vector<Parameter*> params{&weight_};
  if (options_.bias) params.push_back(&bias_);
  return params;
}

std::vector<NamedQuantizer> Linear::Quantizers() {
  std::vector<NamedQuantizer> out;
  for (recipes::Quantizer* q : {input_quantizer_.get(), weight_quantizer_.get(), grad_output_quantizer_.get()}) {
    if (q != nullptr) out.push_back(NamedQuantizer{name(), q});
  }
  return out;
}

}  // namespace layers
}  // namespace teserve
