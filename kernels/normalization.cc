// Checked entry points of kernels/normalization.h: validate metadata (FP32; x and dy
// [n, h] with h > 0; gamma, beta [h]; mu, rsigma [n]; eps finite and >= 0; devices;
// errors name the argument and say expected vs got), then run the CPU reference. The
// CUDA normalization kernels are not wired in yet, so CUDA contexts get UNIMPLEMENTED
// naming the op.
#include "kernels/normalization.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "kernels/cpu/normalization_cpu.h"
#include "kernels/tensor_checks.h"

namespace teserve {
namespace kernels {
namespace {

absl::Status CheckFloatTensor(absl::string_view name, const Tensor& t, const Shape& expected,
                              const Context& ctx) {
  return CheckTensorOfShape(name, t, DType::kFloat32, expected, ctx);
}

// x is the tensor every other shape derives from: FP32 [n, h], h > 0.
absl::Status CheckInput(absl::string_view name, const Tensor& x, const Context& ctx) {
  RETURN_IF_ERROR(CheckDefined(name, x));
  if (x.rank() != 2 || x.dim(1) == 0) {
    return InvalidField(absl::StrCat(name, ".shape"), "[n, h] with h > 0", ShapeToString(x.shape()));
  }
  return CheckFloatTensor(name, x, x.shape(), ctx);
}

// dy [n, h], rsigma [n], gamma [h], and mu [n] when given.
absl::Status CheckBackward(const Tensor& dy, const Tensor& x, const Tensor* mu, const Tensor& rsigma,
                           const Tensor& gamma, const Context& ctx) {
  RETURN_IF_ERROR(CheckInput("x", x, ctx));
  const Shape rows{x.dim(0)};
  RETURN_IF_ERROR(CheckFloatTensor("dy", dy, x.shape(), ctx));
  if (mu != nullptr) RETURN_IF_ERROR(CheckFloatTensor("mu", *mu, rows, ctx));
  RETURN_IF_ERROR(CheckFloatTensor("rsigma", rsigma, rows, ctx));
  return CheckFloatTensor("gamma", gamma, {x.dim(1)}, ctx);
}

}  // namespace

absl::StatusOr<NormForwardOutputs> LayerNormForward(const Context& ctx, const Tensor& x,
                                                    const Tensor& gamma, const Tensor& beta,
                                                    float eps, bool zero_centered_gamma) {
  RETURN_IF_ERROR(CheckInput("x", x, ctx));
  RETURN_IF_ERROR(CheckFloatTensor("gamma", gamma, {x.dim(1)}, ctx));
  RETURN_IF_ERROR(CheckFloatTensor("beta", beta, {x.dim(1)}, ctx));
  RETURN_IF_ERROR(CheckFiniteNonNegative("eps", eps));
  RETURN_IF_ERROR(CpuOnly("LayerNormForward", ctx));
  return cpu::LayerNormForward(ctx, x, gamma, beta, eps, zero_centered_gamma);
}

absl::StatusOr<NormBackwardOutputs> LayerNormBackward(const Context& ctx, const Tensor& dy,
                                                      const Tensor& x, const Tensor& mu,
                                                      const Tensor& rsigma, const Tensor& gamma,
                                                      bool zero_centered_gamma) {
  RETURN_IF_ERROR(CheckBackward(dy, x, &mu, rsigma, gamma, ctx));
  RETURN_IF_ERROR(CpuOnly("LayerNormBackward", ctx));
  return cpu::LayerNormBackward(ctx, dy, x, mu, rsigma, gamma, zero_centered_gamma);
}

absl::StatusOr<NormForwardOutputs> RmsNormForward(const Context& ctx, const Tensor& x,
                                                  const Tensor& gamma, float eps,
                                                  bool zero_centered_gamma) {
  RETURN_IF_ERROR(CheckInput("x", x, ctx));
  RETURN_IF_ERROR(CheckFloatTensor("gamma", gamma, {x.dim(1)}, ctx));
  RETURN_IF_ERROR(CheckFiniteNonNegative("eps", eps));
  RETURN_IF_ERROR(CpuOnly("RmsNormForward", ctx));
  return cpu::RmsNormForward(ctx, x, gamma, eps, zero_centered_gamma);
}

absl::StatusOr<NormBackwardOutputs> RmsNormBackward(const Context& ctx, const Tensor& dy,
                                                    const Tensor& x, const Tensor& rsigma,
                                                    const Tensor& gamma, bool zero_centered_gamma) {
  RETURN_IF_ERROR(CheckBackward(dy, x, nullptr, rsigma, gamma, ctx));
  RETURN_IF_ERROR(CpuOnly("RmsNormBackward", ctx));
  return cpu::RmsNormBackward(ctx, dy, x, rsigma, gamma, zero_centered_gamma);
}

}  // namespace kernels
}  // namespace teserve
