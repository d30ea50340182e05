// Checked entry points of kernels/loss.h: validate metadata and label values (errors
// name the argument and say expected vs got), then run the CPU reference or, for cross
// entropy with logits on a CUDA device, kernels/cuda (labels stay on the host), and MSE
// with both tensors on a CUDA device.
#include "kernels/loss.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "kernels/cpu/loss_cpu.h"
#include "kernels/dispatch.h"
#include "kernels/loss_math.h"
#include "kernels/tensor_checks.h"
#include "kernels/timing.h"

#if TESERVE_WITH_CUDA
#include "kernels/cuda/loss/loss_cuda.h"
#endif

namespace teserve {
namespace kernels {
namespace {

absl::Status CheckMse(const Context& ctx, const Tensor& y, const Tensor& target) {
  RETURN_IF_ERROR(CheckTensor("y", y, DType::kFloat32, kAnyRank, ctx));
  return CheckTensorOfShape("target", target, DType::kFloat32, y.shape(), ctx);
}

// logits FP32 [..., V] with V >= 1; returns the leading shape (the labels' shape).
absl::StatusOr<Shape> CheckLogits(const Context& ctx, const Tensor& logits) {
  RETURN_IF_ERROR(CheckTensor("logits", logits, DType::kFloat32, kAnyRank, ctx));
  if (logits.rank() == 0 || logits.dim(-1) == 0) {
    return InvalidField("logits.shape", "[..., V] with V >= 1 classes", ShapeToString(logits.shape()));
  }
  return Shape(logits.shape().begin(), logits.shape().end() - 1);
}

absl::Status CheckCrossEntropy(const Context& ctx, const Tensor& logits, const Tensor& labels,
                               const CrossEntropyOptions& options) {
  ASSIGN_OR_RETURN(Shape leading, CheckLogits(ctx, logits));
  RETURN_IF_ERROR(CheckLabelSmoothing(options.label_smoothing, "label_smoothing"));
  RETURN_IF_ERROR(CheckDefined("labels", labels));
  // Label values are read on the host: CPU labels also for CUDA logits.
  if (ctx.device.is_cpu()) RETURN_IF_ERROR(CheckDevice("labels", labels, ctx));
  return CheckCrossEntropyLabels(labels, leading, logits.dim(-1), options.ignore_index, "labels");
}

}  // namespace

absl::Status CheckLabelSmoothing(float label_smoothing, absl::string_view field) {
  if (std::isfinite(label_smoothing) && label_smoothing >= 0.0f && label_smoothing <= 1.0f) {
    return absl::OkStatus();
  }
  return InvalidField(field, "a value in [0, 1]", label_smoothing);
}

absl::Status CheckCrossEntropyLabels(const Tensor& labels, const Shape& leading_shape, int64_t num_classes,
                                     int64_t ignore_index, absl::string_view field) {
  RETURN_IF_ERROR(CheckDefined(field, labels));
  if (labels.dtype() != DType::kInt64 && labels.dtype() != DType::kInt32) {
    return InvalidField(absl::StrCat(field, ".dtype"), "INT64 or INT32 (class labels)", DTypeName(labels.dtype()));
  }
  if (labels.shape() != leading_shape) {
    return InvalidField(absl::StrCat(field, ".shape"),
                        absl::StrCat(ShapeToString(leading_shape), " (the leading dimensions of the logits)"),
                        ShapeToString(labels.shape()));
  }
  if (!labels.device().is_cpu()) {
    return InvalidField(absl::StrCat(field, ".device"), "cpu", labels.device().ToString());
  }
  for (int64_t r = 0; r < labels.numel(); ++r) {
    const int64_t label = loss_math::LabelAt(labels, r);
    if (label == ignore_index || (label >= 0 && label < num_classes)) continue;
    return InvalidField(absl::StrCat(field, "[", r, "]"),
                        absl::StrCat("a class in [0, ", num_classes, ") or ignore_index ", ignore_index), label);
  }
  return absl::OkStatus();
}

absl::StatusOr<MseForwardOutput> MseForward(const Context& ctx, const Tensor& y, const Tensor& target) {
  RETURN_IF_ERROR(CheckMse(ctx, y, target));
  ScopedKernelTimer timer(ctx, KernelOp::kMseForward);
  return Dispatch("MseForward", ctx, [&] { return cpu::MseForward(y, target); },
                  TESERVE_CUDA_KERNEL([&] { return cuda::MseForward(ctx, y, target); }));
}

absl::StatusOr<Tensor> MseBackward(const Context& ctx, const Tensor& y, const Tensor& target, float grad_loss) {
  RETURN_IF_ERROR(CheckMse(ctx, y, target));
  ScopedKernelTimer timer(ctx, KernelOp::kMseBackward);
  return Dispatch("MseBackward", ctx, [&] { return cpu::MseBackward(y, target, grad_loss); },
                  TESERVE_CUDA_KERNEL([&] { return cuda::MseBackward(ctx, y, target, grad_loss); }));
}

absl::StatusOr<CrossEntropyForwardOutput> CrossEntropyForward(const Context& ctx, const Tensor& logits,
                                                              const Tensor& labels,
                                                              const CrossEntropyOptions& options) {
  RETURN_IF_ERROR(CheckCrossEntropy(ctx, logits, labels, options));
  ScopedKernelTimer timer(ctx, KernelOp::kCrossEntropyForward);
  return Dispatch("CrossEntropyForward", ctx, [&] { return cpu::CrossEntropyForward(logits, labels, options); },
                  TESERVE_CUDA_KERNEL([&] { return cuda::CrossEntropyForward(ctx, logits, labels, options); }));
}

absl::StatusOr<Tensor> CrossEntropyBackward(const Context& ctx, const Tensor& logits, const Tensor& labels,
                                            const Tensor& lse, int64_t num_valid,
                                            const CrossEntropyOptions& options, float grad_loss) {
  RETURN_IF_ERROR(CheckCrossEntropy(ctx, logits, labels, options));
  const int64_t tokens = labels.numel();
  RETURN_IF_ERROR(CheckTensorOfShape("lse", lse, DType::kFloat32, {tokens}, ctx));
  if (num_valid < 0 || num_valid > tokens) {
    return InvalidField("num_valid", absl::StrCat("a count in 0..", tokens, " (the tokens)"), num_valid);
  }
  ScopedKernelTimer timer(ctx, KernelOp::kCrossEntropyBackward);
  return Dispatch(
      "CrossEntropyBackward", ctx,
      [&] { return cpu::CrossEntropyBackward(logits, labels, lse, num_valid, options, grad_loss); },
      TESERVE_CUDA_KERNEL(
          [&] { return cuda::CrossEntropyBackward(ctx, logits, labels, lse, num_valid, options, grad_loss); }));
}

}  // namespace kernels
}  // namespace teserve
