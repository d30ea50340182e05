#include "train/loss.h"

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "kernels/loss.h"

namespace teserve {
namespace train {
namespace {

kernels::CrossEntropyOptions CrossEntropyOptionsOf(const LossOptions& loss) {
  kernels::CrossEntropyOptions options;
  options.label_smoothing = loss.label_smoothing;
  options.ignore_index = loss.ignore_index;
  return options;
}

int64_t LeadingCount(const Shape& shape) {
  int64_t rows = 1;
  for (size_t i = 0; i + 1 < shape.size(); ++i) rows *= shape[i];
  return rows;
}

}  // namespace

absl::StatusOr<LossOptions> LossFromProto(const v1::LossSpec& spec) {
  LossOptions loss;
  switch (spec.loss_case()) {
    case v1::LossSpec::kMse:
      loss.kind = LossOptions::Kind::kMse;
      return loss;
    case v1::LossSpec::kCrossEntropy:
      loss.kind = LossOptions::Kind::kCrossEntropy;
      loss.label_smoothing = spec.cross_entropy().label_smoothing();
      if (spec.cross_entropy().has_ignore_index()) loss.ignore_index = spec.cross_entropy().ignore_index();
      RETURN_IF_ERROR(kernels::CheckLabelSmoothing(loss.label_smoothing, "loss.cross_entropy.label_smoothing"));
      return loss;
    case v1::LossSpec::LOSS_NOT_SET:
      break;
  }
  return InvalidField("loss", "one of mse, cross_entropy", "none");
}

absl::Status ValidateLossTarget(const LossOptions& loss, const Shape& output_shape, const Tensor& target) {
  if (!target.defined()) return InvalidField("target", "a tensor", "none");
  if (!target.device().is_cpu()) return InvalidField("target.device", "cpu", target.device().ToString());
  if (loss.kind == LossOptions::Kind::kMse) {
    if (target.dtype() != DType::kFloat32) {
      return InvalidField("target.dtype", "FLOAT32 (an mse target; BFLOAT16 / FLOAT16 on the wire)",
                          DTypeName(target.dtype()));
    }
    if (target.shape() != output_shape) {
      return InvalidField("target.shape", absl::StrCat(ShapeToString(output_shape), " (the model output's shape)"),
                          ShapeToString(target.shape()));
    }
    return absl::OkStatus();
  }
  if (output_shape.empty() || output_shape.back() == 0) {
    return InvalidField("loss.cross_entropy", "a model output of shape [..., V] with V >= 1 classes",
                        ShapeToString(output_shape));
  }
  RETURN_IF_ERROR(kernels::CheckLabelSmoothing(loss.label_smoothing, "loss.cross_entropy.label_smoothing"));
  const Shape leading(output_shape.begin(), output_shape.end() - 1);
  return kernels::CheckCrossEntropyLabels(target, leading, output_shape.back(), loss.ignore_index, "target");
}

absl::StatusOr<LossResult> ComputeLoss(const Context& ctx, const LossOptions& loss, const Tensor& output,
                                       const Tensor& target) {
  LossResult result;
  if (loss.kind == LossOptions::Kind::kMse) {
    ASSIGN_OR_RETURN(kernels::MseForwardOutput fwd, kernels::MseForward(ctx, output, target));
    ASSIGN_OR_RETURN(result.grad_output, kernels::MseBackward(ctx, output, target, /*grad_loss=*/1.0f));
    result.loss = fwd.loss;
    result.num_tokens = LeadingCount(output.shape());
    return result;
  }
  const kernels::CrossEntropyOptions options = CrossEntropyOptionsOf(loss);
  ASSIGN_OR_RETURN(kernels::CrossEntropyForwardOutput fwd, kernels::CrossEntropyForward(ctx, output, target, options));
  ASSIGN_OR_RETURN(result.grad_output, kernels::CrossEntropyBackward(ctx, output, target, fwd.lse, fwd.num_valid,
                                                                     options, /*grad_loss=*/1.0f));
  result.loss = fwd.loss;
  result.num_tokens = fwd.num_valid;
  return result;
}

}  // namespace train
}  // namespace teserve
