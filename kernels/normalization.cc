// Checked entry points of kernels/normalization.h: validate metadata (FP32; x and dy
// [n, h] with h > 0; gamma, beta [h]; mu, rsigma [n]; eps finite and >= 0; devices;
// errors name the argument and say expected vs got), then run the CPU reference. The
// CUDA normalization kernels are not wired in yet, so CUDA contexts get UNIMPLEMENTED
// naming the op.
#include "kernels/normalization.h"

#include <cmath>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "kernels/cpu/normalization_cpu.h"

namespace teserve {
namespace kernels {
namespace {

// Defined, FP32, of shape `expected`, on the Context's device.
absl::Status CheckFloatTensor(absl::string_view name, const Tensor& t, const Shape& expected,
                              const Context& ctx) {
  if (!t.defined()) return InvalidField(name, "a tensor", "an undefined tensor");
  if (t.dtype() != DType::kFloat32) {
    return InvalidField(absl::StrCat(name, ".dtype"), "FLOAT32", DTypeName(t.dtype()));
  }
  if (t.shape() != expected) {
    return InvalidField(absl::StrCat(name, ".shape"), ShapeToString(expected), ShapeToString(t.shape()));
  }
  if (t.device() != ctx.device) {
    return InvalidField(absl::StrCat(name, ".device"), ctx.device.ToString(), t.device().ToString());
  }
  return absl::OkStatus();
}

// x is the tensor every other shape derives from: FP32 [n, h], h > 0.
absl::Status CheckInput(absl::string_view name, const Tensor& x, const Context& ctx) {
  if (!x.defined()) return InvalidField(name, "a tensor", "an undefined tensor");
  if (x.rank() != 2 || x.dim(1) == 0) {
    return InvalidField(absl::StrCat(name, ".shape"), "[n, h] with h > 0", ShapeToString(x.shape()));
  }
  return CheckFloatTensor(name, x, x.shape(), ctx);
}

absl::Status CheckEps(float eps) {
  if (std::isfinite(eps) && eps >= 0.0f) return absl::OkStatus();
  return InvalidField("eps", "a finite value >= 0", eps);
}

absl::Status CpuOnly(absl::string_view op, const Context& ctx) {
  if (ctx.device.is_cpu()) return absl::OkStatus();
  return absl::UnimplementedError(
      absl::StrCat(op, " is not implemented on ", ctx.device.ToString(), " yet"));
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
  RETURN_IF_ERROR(CheckEps(eps));
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
  RETURN_IF_ERROR(CheckEps(eps));
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
