#include "layers/normalization.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "kernels/elementwise.h"
#include "kernels/normalization.h"
#include "layers/shape_check.h"

namespace teserve {
namespace layers {
namespace {

struct NormSaved : public SavedActivations {
  Shape input_shape;
  Tensor x;       // [N, H]
  Tensor mu;      // [N], LayerNorm only
  Tensor rsigma;  // [N]
};

}  // namespace

absl::StatusOr<std::unique_ptr<Normalization>> Normalization::Create(std::string name,
                                                                     const NormOptions& options) {
  std::unique_ptr<Normalization> layer(new Normalization(name, options));
  const Shape shape{options.hidden_size};
  ASSIGN_OR_RETURN(layer->gamma_.value, Tensor::Zeros(DType::kFloat32, shape));
  ASSIGN_OR_RETURN(layer->gamma_.grad, Tensor::Zeros(DType::kFloat32, shape));
  layer->gamma_.name = absl::StrCat(name, ".weight");
  if (!options.zero_centered_gamma) {
    absl::Span<float> gamma = layer->gamma_.value.mutable_floats();
    std::fill(gamma.begin(), gamma.end(), 1.0f);
  }
  if (layer->has_beta()) {
    ASSIGN_OR_RETURN(layer->beta_.value, Tensor::Zeros(DType::kFloat32, shape));
    ASSIGN_OR_RETURN(layer->beta_.grad, Tensor::Zeros(DType::kFloat32, shape));
    layer->beta_.name = absl::StrCat(name, ".bias");
  }
  return layer;
}

std::string Normalization::kind() const {
  return options_.kind == NormKind::kLayerNorm ? "LayerNorm" : "RMSNorm";
}

absl::StatusOr<std::vector<Shape>> Normalization::OutputShapes(const std::vector<Shape>& input_shapes,
                                                               absl::string_view field) const {
  RETURN_IF_ERROR(ExpectInputCount(input_shapes, 1, field));
  RETURN_IF_ERROR(ExpectFeatures(input_shapes[0], options_.hidden_size, absl::StrCat(field, "[0]"),
                                 absl::StrCat("hidden_size of layer ", Quoted(name()))));
  return std::vector<Shape>{input_shapes[0]};
}

absl::StatusOr<ForwardOutput> Normalization::Forward(const Context& ctx, const std::vector<Tensor>& inputs,
                                                     const ForwardOptions& options) {
  ASSIGN_OR_RETURN(Tensor x, inputs[0].As2D());
  kernels::NormForwardOutputs result;
  if (x.dtype() != DType::kFloat32 || options_.params_dtype != DType::kFloat32) {
    // 16-bit activations: the general entry point reads x in its dtype and writes y in
    // params_dtype (statistics in FP32, as for FP32 tensors).
    ASSIGN_OR_RETURN(kernels::NormForwardResult r,
                     kernels::NormalizationForward(ctx, Type(), x, gamma_.value, beta_.value, KernelOptions()));
    result.y = std::move(r.y);
    result.mu = std::move(r.mu);
    result.rsigma = std::move(r.rsigma);
  } else if (has_beta()) {
    ASSIGN_OR_RETURN(result, kernels::LayerNormForward(ctx, x, gamma_.value, beta_.value, options_.eps,
                                                       options_.zero_centered_gamma));
  } else {
    ASSIGN_OR_RETURN(result, kernels::RmsNormForward(ctx, x, gamma_.value, options_.eps,
                                                     options_.zero_centered_gamma));
  }
  ForwardOutput out;
  ASSIGN_OR_RETURN(Tensor y, result.y.Reshape(inputs[0].shape()));
  out.outputs.push_back(std::move(y));
  if (options.save_for_backward) out.saved = Save(inputs[0].shape(), x, std::move(result.mu), std::move(result.rsigma));
  return out;
}

absl::StatusOr<ForwardOutput> Normalization::ForwardFused(const Context& ctx, const std::vector<Tensor>& inputs,
                                                          const ForwardOptions& options,
                                                          const recipes::FusedCast& cast, bool columnwise,
                                                          bool write_y, QuantizedTensor* q) {
  ASSIGN_OR_RETURN(Tensor x, inputs[0].As2D());
  kernels::NormForwardOptions norm = KernelOptions();
  norm.write_y = write_y;
  if (cast.mode == ScalingMode::kPerTensor) {
    norm.quantize = true;
    norm.quantize_options.format = cast.format;
    norm.quantize_options.scale = cast.scale;
    norm.quantize_options.rowwise = true;
    norm.quantize_options.columnwise = columnwise;
    norm.quantize_options.defer_amax = cast.defer_amax;
  } else if (cast.mode == ScalingMode::kMxfp8_1D) {
    norm.mxfp8 = true;
    norm.mxfp8_options.format = cast.format;
    norm.mxfp8_options.rowwise = true;
    norm.mxfp8_options.columnwise = columnwise;
    norm.mxfp8_options.defer_amax = cast.defer_amax;
  } else {
    return absl::InternalError(
        absl::StrCat("Normalization::ForwardFused: no fused ", ScalingModeName(cast.mode), " output"));
  }
  ASSIGN_OR_RETURN(kernels::NormForwardResult r,
                   kernels::NormalizationForward(ctx, Type(), x, gamma_.value, beta_.value, norm));
  *q = std::move(r.fp8);
  ForwardOutput out;
  if (write_y) {
    ASSIGN_OR_RETURN(Tensor y, r.y.Reshape(inputs[0].shape()));
    out.outputs.push_back(std::move(y));
  }
  if (options.save_for_backward) out.saved = Save(inputs[0].shape(), x, std::move(r.mu), std::move(r.rsigma));
  return out;
}

kernels::NormForwardOptions Normalization::KernelOptions() const {
  kernels::NormForwardOptions norm;
  norm.eps = options_.eps;
  norm.zero_centered_gamma = options_.zero_centered_gamma;
  norm.y_dtype = options_.params_dtype;
  return norm;
}

std::unique_ptr<SavedActivations> Normalization::Save(const Shape& input_shape, const Tensor& x, Tensor mu,
                                                      Tensor rsigma) const {
  auto saved = std::make_unique<NormSaved>();
  saved->input_shape = input_shape;
  saved->x = x;
  saved->mu = std::move(mu);
  saved->rsigma = std::move(rsigma);
  return saved;
}

absl::StatusOr<std::vector<Tensor>> Normalization::Backward(const Context& ctx, SavedActivations& saved_base,
                                                            const std::vector<Tensor>& grad_outputs,
                                                            SideGrads* side_grads) {
  auto& saved = static_cast<NormSaved&>(saved_base);
  ASSIGN_OR_RETURN(Tensor dy2d, grad_outputs[0].As2D());
  // dy in x's dtype, as the kernels take them (dx comes back in it too).
  ASSIGN_OR_RETURN(const Tensor dy, kernels::Convert(ctx, dy2d, saved.x.dtype()));
  // The gradients are added into: a deferred zero fill happens first.
  RETURN_IF_ERROR(FillDeferredGrad(ctx, gamma_));
  if (has_beta()) RETURN_IF_ERROR(FillDeferredGrad(ctx, beta_));
  kernels::NormBackwardOutputs grads;
  if (saved.x.dtype() != DType::kFloat32) {
    kernels::NormBackwardOptions norm;
    norm.zero_centered_gamma = options_.zero_centered_gamma;
    ASSIGN_OR_RETURN(grads, kernels::NormalizationBackward(ctx, Type(), dy, saved.x, saved.mu, saved.rsigma,
                                                           gamma_.value, norm));
    if (has_beta()) RETURN_IF_ERROR(kernels::AddInto(ctx, grads.dbeta, &beta_.grad));
  } else if (has_beta()) {
    ASSIGN_OR_RETURN(grads, kernels::LayerNormBackward(ctx, dy, saved.x, saved.mu, saved.rsigma, gamma_.value,
                                                       options_.zero_centered_gamma));
    RETURN_IF_ERROR(kernels::AddInto(ctx, grads.dbeta, &beta_.grad));
  } else {
    ASSIGN_OR_RETURN(grads, kernels::RmsNormBackward(ctx, dy, saved.x, saved.rsigma, gamma_.value,
                                                     options_.zero_centered_gamma));
  }
  RETURN_IF_ERROR(kernels::AddInto(ctx, grads.dgamma, &gamma_.grad));
  ASSIGN_OR_RETURN(Tensor dx, grads.dx.Reshape(saved.input_shape));
  return std::vector<Tensor>{std::move(dx)};
}

std::vector<Parameter*> Normalization::Parameters() {
  std::vector<Parameter*> params{&gamma_};
  if (has_beta()) params.push_back(&beta_);
  return params;
}

}  // namespace layers
}  // namespace teserve
