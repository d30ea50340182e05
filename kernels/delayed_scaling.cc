// Checked entry point of kernels/delayed_scaling.h: metadata checks, then the CPU loop
// below (kernels/scaling_math.h per quantizer) or the one-launch CUDA kernel.
#include "kernels/delayed_scaling.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "kernels/scaling_math.h"
#include "kernels/dispatch.h"
#include "kernels/tensor_checks.h"

#if TESERVE_WITH_CUDA
#include "kernels/cuda/scaling/scaling_cuda.h"
#endif

namespace teserve {
namespace kernels {
namespace {

absl::Status CheckPresent(absl::string_view name, const Tensor* t) {
  if (t == nullptr) return InvalidField(name, "a tensor", "none");
  return absl::OkStatus();
}

absl::Status CheckTensors(const Context& ctx, const DelayedScalingTensors& t,
                          const DelayedScalingUpdateOptions& options) {
  if (!std::isfinite(options.margin)) return InvalidField("options.margin", "a finite value", options.margin);
  RETURN_IF_ERROR(CheckPresent("history", t.history));
  RETURN_IF_ERROR(CheckTensor("history", *t.history, DType::kFloat32, 2, ctx));
  if (t.history->dim(1) < 1) {
    return InvalidField("history.shape", "[N, H] with H >= 1", ShapeToString(t.history->shape()));
  }
  const int64_t n = t.history->dim(0);
  RETURN_IF_ERROR(CheckPresent("scale", t.scale));
  RETURN_IF_ERROR(CheckTensorOfShape("scale", *t.scale, DType::kFloat32, {n}, ctx));
  RETURN_IF_ERROR(CheckPresent("scale_inv", t.scale_inv));
  RETURN_IF_ERROR(CheckTensorOfShape("scale_inv", *t.scale_inv, DType::kFloat32, {n}, ctx));
  RETURN_IF_ERROR(CheckPresent("fp8_max", t.fp8_max));
  RETURN_IF_ERROR(CheckTensorOfShape("fp8_max", *t.fp8_max, DType::kFloat32, {n}, ctx));
  if (t.enabled != nullptr) RETURN_IF_ERROR(CheckTensorOfShape("enabled", *t.enabled, DType::kInt32, {1}, ctx));
  return absl::OkStatus();
}

absl::Status UpdateCpu(const DelayedScalingTensors& t, const DelayedScalingUpdateOptions& options,
                       float margin_factor) {
  if (t.enabled != nullptr && t.enabled->data<int32_t>()[0] == 0) return absl::OkStatus();
  const int64_t n = t.history->dim(0);
  const int64_t h = t.history->dim(1);
  for (int64_t q = 0; q < n; ++q) {
    float* window = t.history->data<float>() + q * h;
    float amax = window[0];
    if (options.use_max) {
      for (int64_t i = 0; i < h; ++i) amax = scaling_math::NanMax(amax, window[i]);
    }
    float& scale = t.scale->data<float>()[q];
    scale = scaling_math::DelayedScale(amax, t.fp8_max->data<float>()[q], margin_factor, scale);
    t.scale_inv->data<float>()[q] = 1.0f / scale;
    if (window[0] != 0.0f) {
      std::rotate(window, window + 1, window + h);
      window[0] = 0.0f;
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status DelayedScalingUpdate(const Context& ctx, const DelayedScalingTensors& tensors,
                                  const DelayedScalingUpdateOptions& options) {
  RETURN_IF_ERROR(CheckTensors(ctx, tensors, options));
  const float margin_factor = std::exp2(options.margin);
  return Dispatch("DelayedScalingUpdate", ctx, [&] { return UpdateCpu(tensors, options, margin_factor); },
                  TESERVE_CUDA_KERNEL([&] {
                    return cuda::DelayedScalingUpdate(ctx, tensors, options.use_max, margin_factor);
                  }));
}

}  // namespace kernels
}  // namespace teserve
