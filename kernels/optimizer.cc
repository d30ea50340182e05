// Checked entry points of kernels/optimizer.h: validate every tensor of the list, then
// run the CPU reference (the loops below, one element at a time through
// kernels/optimizer_math.h) or the CUDA multi-tensor kernels.
#include "kernels/optimizer.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "kernels/dispatch.h"
#include "kernels/tensor_checks.h"

#if TESERVE_WITH_CUDA
#include "kernels/cuda/optimizer/optimizer_cuda.h"
#endif

namespace teserve {
namespace kernels {
namespace {

using optimizer_math::ModelCopyKind;

absl::Status CheckState(const std::string& name, const Tensor* t, const Tensor& param, const Context& ctx) {
  if (t == nullptr) return InvalidField(name, "a tensor", "none");
  return CheckTensorOfShape(name, *t, DType::kFloat32, param.shape(), ctx);
}

ModelCopyKind CopyKindOf(DType dtype) {
  switch (dtype) {
    case DType::kBFloat16: return ModelCopyKind::kBFloat16;
    case DType::kFloat16: return ModelCopyKind::kFloat16;
    case DType::kFloat8E4M3: return ModelCopyKind::kE4M3;
    case DType::kFloat8E5M2: return ModelCopyKind::kE5M2;
    default: return ModelCopyKind::kNone;
  }
}

absl::Status CheckTensors(const Context& ctx, absl::Span<const OptimizerTensor> tensors, bool adamw,
                          bool momentum, int64_t step) {
  if (step < 1) return InvalidField("step", "a step >= 1", step);
  for (size_t i = 0; i < tensors.size(); ++i) {
    const OptimizerTensor& t = tensors[i];
    const std::string prefix = absl::StrCat("tensors[", i, "].");
    if (t.param == nullptr) return InvalidField(prefix + "param", "a tensor", "none");
    RETURN_IF_ERROR(CheckTensor(prefix + "param", *t.param, DType::kFloat32, kAnyRank, ctx));
    RETURN_IF_ERROR(CheckState(prefix + "grad", t.grad, *t.param, ctx));
    if (adamw || momentum) RETURN_IF_ERROR(CheckState(prefix + "exp_avg", t.exp_avg, *t.param, ctx));
    if (adamw) RETURN_IF_ERROR(CheckState(prefix + "exp_avg_sq", t.exp_avg_sq, *t.param, ctx));
    if (t.model_copy != nullptr) {
      const std::string name = prefix + "model_copy";
      RETURN_IF_ERROR(CheckDefined(name, *t.model_copy));
      if (CopyKindOf(t.model_copy->dtype()) == ModelCopyKind::kNone) {
        return InvalidField(name + ".dtype", "BFLOAT16, FLOAT16, FLOAT8_E4M3 or FLOAT8_E5M2",
                            DTypeName(t.model_copy->dtype()));
      }
      RETURN_IF_ERROR(CheckShape(name, *t.model_copy, t.param->shape()));
      RETURN_IF_ERROR(CheckDevice(name, *t.model_copy, ctx));
      if (IsFloat8(t.model_copy->dtype())) {
        RETURN_IF_ERROR(CheckFinitePositive(prefix + "model_copy_scale", t.model_copy_scale));
      }
    }
  }
  return absl::OkStatus();
}

// Rewrites the model copy (if any) from the updated master weights.
void WriteModelCopyCpu(const OptimizerTensor& t) {
  if (t.model_copy == nullptr) return;
  const ModelCopyKind kind = CopyKindOf(t.model_copy->dtype());
  const float* p = t.param->data<float>();
  const int64_t n = t.param->numel();
  if (optimizer_math::IsSixteenBitCopy(kind)) {
    uint16_t* out = t.model_copy->data<uint16_t>();
    for (int64_t j = 0; j < n; ++j) out[j] = optimizer_math::ModelCopyCode(kind, p[j], t.model_copy_scale);
  } else {
    uint8_t* out = t.model_copy->data<uint8_t>();
    for (int64_t j = 0; j < n; ++j) {
      out[j] = static_cast<uint8_t>(optimizer_math::ModelCopyCode(kind, p[j], t.model_copy_scale));
    }
  }
}

absl::Status AdamWCpu(absl::Span<const OptimizerTensor> tensors, const optimizer_math::AdamWScalars& s) {
  for (const OptimizerTensor& t : tensors) {
    float* p = t.param->data<float>();
    const float* g = t.grad->data<float>();
    float* m = t.exp_avg->data<float>();
    float* v = t.exp_avg_sq->data<float>();
    for (int64_t j = 0; j < t.param->numel(); ++j) optimizer_math::AdamWElement(s, g[j], &p[j], &m[j], &v[j]);
    WriteModelCopyCpu(t);
  }
  return absl::OkStatus();
}

absl::Status SgdCpu(absl::Span<const OptimizerTensor> tensors, const optimizer_math::SgdScalars& s,
                    bool momentum) {
  for (const OptimizerTensor& t : tensors) {
    float* p = t.param->data<float>();
    const float* g = t.grad->data<float>();
    float* buf = momentum ? t.exp_avg->data<float>() : nullptr;
    for (int64_t j = 0; j < t.param->numel(); ++j) {
      optimizer_math::SgdElement(s, g[j], &p[j], momentum ? &buf[j] : nullptr);
    }
    WriteModelCopyCpu(t);
  }
  return absl::OkStatus();
}

}  // namespace

optimizer_math::AdamWScalars AdamWScalarsForStep(const AdamWOptions& options, int64_t step) {
  optimizer_math::AdamWScalars s;
  s.beta1 = options.beta1;
  s.one_minus_beta1 = 1.0f - options.beta1;
  s.beta2 = options.beta2;
  s.one_minus_beta2 = 1.0f - options.beta2;
  s.eps = options.eps;
  s.decay = 1.0f - options.lr * options.weight_decay;
  const float bias_correction1 = 1.0f - std::pow(options.beta1, static_cast<float>(step));
  const float bias_correction2 = 1.0f - std::pow(options.beta2, static_cast<float>(step));
  s.step_size = options.lr / bias_correction1;
  s.bias_correction2_sqrt = std::sqrt(bias_correction2);
  return s;
}

optimizer_math::SgdScalars SgdScalarsForStep(const SgdOptions& options, int64_t step) {
  optimizer_math::SgdScalars s;
  s.lr = options.lr;
  s.weight_decay = options.weight_decay;
  s.momentum = options.momentum;
  s.one_minus_dampening = 1.0f - options.dampening;
  s.nesterov = options.nesterov;
  s.first_step = step == 1;
  return s;
}

absl::Status AdamWStep(const Context& ctx, absl::Span<const OptimizerTensor> tensors,
                       const AdamWOptions& options, int64_t step) {
  RETURN_IF_ERROR(CheckTensors(ctx, tensors, /*adamw=*/true, /*momentum=*/false, step));
  const optimizer_math::AdamWScalars s = AdamWScalarsForStep(options, step);
  return Dispatch("AdamWStep", ctx, [&] { return AdamWCpu(tensors, s); },
                  TESERVE_CUDA_KERNEL([&] { return cuda::AdamWStep(ctx, tensors, s); }));
}

absl::Status SgdStep(const Context& ctx, absl::Span<const OptimizerTensor> tensors, const SgdOptions& options,
                     int64_t step) {
  const bool momentum = options.momentum != 0.0f;
  RETURN_IF_ERROR(CheckTensors(ctx, tensors, /*adamw=*/false, momentum, step));
  const optimizer_math::SgdScalars s = SgdScalarsForStep(options, step);
  return Dispatch("SgdStep", ctx, [&] { return SgdCpu(tensors, s, momentum); },
                  TESERVE_CUDA_KERNEL([&] { return cuda::SgdStep(ctx, tensors, s); }));
}

}  // namespace kernels
}  // namespace teserve
