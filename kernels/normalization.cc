// Checked entry points of kernels/normalization.h: validate metadata (dtypes; x and dy
// [n, h] with h > 0; gamma, beta [h]; mu, rsigma [n]; eps finite and >= 0; options;
// devices; errors name the argument and say expected vs got), then dispatch on the
// Context's device: kernels/cpu for the CPU, kernels/cuda when the CUDA backend is
// compiled in (TESERVE_WITH_CUDA from //tools/cuda:config).
#include "kernels/normalization.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "kernels/block_quantize.h"
#include "kernels/cast.h"
#include "kernels/cpu/normalization_cpu.h"
#include "kernels/dispatch.h"
#include "kernels/tensor_checks.h"
#include "kernels/timing.h"

#if TESERVE_WITH_CUDA
#include "kernels/cuda/normalization/normalization_cuda.h"
#endif

namespace teserve {
namespace kernels {
namespace {

constexpr char kNormTypes[] = "one of FLOAT32, FLOAT16, BFLOAT16";

// MXFP8 output on CUDA in one fused kernel (kernels/cuda/normalization/normalization_register_tile.cu)
// for the inputs cuda::FusesMxfp8 accepts. false: every device composes the FP32 norm and
// QuantizeMxfp8 (two passes on CUDA), as for the inputs the fused kernel does not take.
constexpr bool kFusedCudaNormMxfp8 = true;

absl::Status CheckFloatTensor(absl::string_view name, const Tensor& t, const Shape& expected,
                              const Context& ctx) {
  return CheckTensorOfShape(name, t, DType::kFloat32, expected, ctx);
}

// x is the tensor every other shape derives from: [n, h], h > 0, of `dtype` (or, when
// `dtype` is null, of any of FP32, FP16, BF16).
absl::Status CheckInput(absl::string_view name, const Tensor& x, const DType* dtype,
                        const Context& ctx) {
  RETURN_IF_ERROR(CheckDefined(name, x));
  if (x.rank() != 2 || x.dim(1) == 0) {
    return InvalidField(absl::StrCat(name, ".shape"), "[n, h] with h > 0", ShapeToString(x.shape()));
  }
  if (dtype != nullptr) return CheckTensorOfShape(name, x, *dtype, x.shape(), ctx);
  if (!IsHighPrecisionFloat(x.dtype())) {
    return InvalidField(absl::StrCat(name, ".dtype"), kNormTypes, DTypeName(x.dtype()));
  }
  return CheckDevice(name, x, ctx);
}

absl::Status CheckInput(absl::string_view name, const Tensor& x, const Context& ctx) {
  const DType fp32 = DType::kFloat32;
  return CheckInput(name, x, &fp32, ctx);
}

// dy [n, h] of x's dtype, rsigma [n], gamma [h], and mu [n] when given.
absl::Status CheckBackward(const Tensor& dy, const Tensor& x, const Tensor* mu, const Tensor& rsigma,
                           const Tensor& gamma, const Context& ctx) {
  RETURN_IF_ERROR(CheckInput("x", x, ctx));
  const Shape rows{x.dim(0)};
  RETURN_IF_ERROR(CheckFloatTensor("dy", dy, x.shape(), ctx));
  if (mu != nullptr) RETURN_IF_ERROR(CheckFloatTensor("mu", *mu, rows, ctx));
  RETURN_IF_ERROR(CheckFloatTensor("rsigma", rsigma, rows, ctx));
  return CheckFloatTensor("gamma", gamma, {x.dim(1)}, ctx);
}

// A tensor that RMSNorm does not take must be left undefined.
absl::Status CheckAbsentForRmsNorm(absl::string_view name, const Tensor& t) {
  if (!t.defined()) return absl::OkStatus();
  return InvalidField(name, "no tensor for RMSNorm", "a tensor");
}

absl::Status CheckSmMargin(absl::string_view field, int sm_margin) {
  if (sm_margin >= 0) return absl::OkStatus();
  return InvalidField(field, ">= 0", sm_margin);
}

absl::Status CheckForwardOptions(const NormForwardOptions& options) {
  RETURN_IF_ERROR(CheckFiniteNonNegative("options.eps", options.eps));
  if (options.y_dtype.has_value() && !IsHighPrecisionFloat(*options.y_dtype)) {
    return InvalidField("options.y_dtype", kNormTypes, DTypeName(*options.y_dtype));
  }
  if (!options.write_y && !options.quantize && !options.mxfp8) {
    return InvalidField("options.write_y", "true when options.quantize and options.mxfp8 are false",
                        "false");
  }
  if (options.quantize && options.mxfp8) {
    return InvalidField("options.mxfp8", "false when options.quantize is set", "true");
  }
  if (options.mxfp8) {
    const Mxfp8QuantizeOptions& q = options.mxfp8_options;
    RETURN_IF_ERROR(CheckFloat8("options.mxfp8_options.format", q.format));
    RETURN_IF_ERROR(CheckCopiesRequested("options.mxfp8_options", q.rowwise, q.columnwise));
    if (q.dbias != nullptr) {
      return InvalidField("options.mxfp8_options.dbias", "null (no dbias of a norm output)",
                          "a tensor");
    }
  }
  if (options.quantize) {
    const PerTensorQuantizeOptions& q = options.quantize_options;
    RETURN_IF_ERROR(CheckFloat8("options.quantize_options.format", q.format));
    RETURN_IF_ERROR(CheckFinitePositive("options.quantize_options.scale", q.scale));
    RETURN_IF_ERROR(CheckCopiesRequested("options.quantize_options", q.rowwise, q.columnwise));
  }
  return CheckSmMargin("options.sm_margin", options.sm_margin);
}

absl::StatusOr<NormForwardResult> DispatchForward(absl::string_view op, const Context& ctx,
                                                  NormType type, const Tensor& x,
                                                  const Tensor& gamma, const Tensor& beta,
                                                  const NormForwardOptions& options) {
  return Dispatch(op, ctx, [&] { return cpu::NormalizationForward(ctx, type, x, gamma, beta, options); },
                  TESERVE_CUDA_KERNEL([&] { return cuda::NormalizationForward(ctx, type, x, gamma, beta, options); }));
}

// The FP32 entry points run the CPU reference directly on the CPU (unchanged behaviour)
// and the extended path with FP32 options elsewhere (unused in CPU-only builds).
[[maybe_unused]] NormForwardOutputs ToForwardOutputs(NormForwardResult result) {
  NormForwardOutputs out;
  out.y = std::move(result.y);
  out.mu = std::move(result.mu);
  out.rsigma = std::move(result.rsigma);
  return out;
}

[[maybe_unused]] NormForwardOptions Fp32ForwardOptions(float eps, bool zero_centered_gamma) {
  NormForwardOptions options;
  options.eps = eps;
  options.zero_centered_gamma = zero_centered_gamma;
  options.y_dtype = DType::kFloat32;
  return options;
}

}  // namespace

absl::StatusOr<NormForwardOutputs> LayerNormForward(const Context& ctx, const Tensor& x,
                                                    const Tensor& gamma, const Tensor& beta,
                                                    float eps, bool zero_centered_gamma) {
  RETURN_IF_ERROR(CheckInput("x", x, ctx));
  RETURN_IF_ERROR(CheckFloatTensor("gamma", gamma, {x.dim(1)}, ctx));
  RETURN_IF_ERROR(CheckFloatTensor("beta", beta, {x.dim(1)}, ctx));
  RETURN_IF_ERROR(CheckFiniteNonNegative("eps", eps));
  ScopedKernelTimer timer(ctx, KernelOp::kLayerNormForward);
  return Dispatch("LayerNormForward", ctx,
                  [&] { return cpu::LayerNormForward(ctx, x, gamma, beta, eps, zero_centered_gamma); },
                  TESERVE_CUDA_KERNEL([&]() -> absl::StatusOr<NormForwardOutputs> {
                    ASSIGN_OR_RETURN(NormForwardResult result,
                                     cuda::NormalizationForward(ctx, NormType::kLayerNorm, x, gamma, beta,
                                                                Fp32ForwardOptions(eps, zero_centered_gamma)));
                    return ToForwardOutputs(std::move(result));
                  }));
}

absl::StatusOr<NormBackwardOutputs> LayerNormBackward(const Context& ctx, const Tensor& dy,
                                                      const Tensor& x, const Tensor& mu,
                                                      const Tensor& rsigma, const Tensor& gamma,
                                                      bool zero_centered_gamma) {
  RETURN_IF_ERROR(CheckBackward(dy, x, &mu, rsigma, gamma, ctx));
  ScopedKernelTimer timer(ctx, KernelOp::kLayerNormBackward);
  return Dispatch("LayerNormBackward", ctx,
                  [&] { return cpu::LayerNormBackward(ctx, dy, x, mu, rsigma, gamma, zero_centered_gamma); },
                  TESERVE_CUDA_KERNEL([&] {
                    NormBackwardOptions options;
                    options.zero_centered_gamma = zero_centered_gamma;
                    return cuda::NormalizationBackward(ctx, NormType::kLayerNorm, dy, x, mu, rsigma, gamma,
                                                       options);
                  }));
}

absl::StatusOr<NormForwardOutputs> RmsNormForward(const Context& ctx, const Tensor& x,
                                                  const Tensor& gamma, float eps,
                                                  bool zero_centered_gamma) {
  RETURN_IF_ERROR(CheckInput("x", x, ctx));
  RETURN_IF_ERROR(CheckFloatTensor("gamma", gamma, {x.dim(1)}, ctx));
  RETURN_IF_ERROR(CheckFiniteNonNegative("eps", eps));
  ScopedKernelTimer timer(ctx, KernelOp::kRmsNormForward);
  return Dispatch("RmsNormForward", ctx,
                  [&] { return cpu::RmsNormForward(ctx, x, gamma, eps, zero_centered_gamma); },
                  TESERVE_CUDA_KERNEL([&]() -> absl::StatusOr<NormForwardOutputs> {
                    ASSIGN_OR_RETURN(NormForwardResult result,
                                     cuda::NormalizationForward(ctx, NormType::kRmsNorm, x, gamma, Tensor(),
                                                                Fp32ForwardOptions(eps, zero_centered_gamma)));
                    return ToForwardOutputs(std::move(result));
                  }));
}

absl::StatusOr<NormBackwardOutputs> RmsNormBackward(const Context& ctx, const Tensor& dy,
                                                    const Tensor& x, const Tensor& rsigma,
                                                    const Tensor& gamma, bool zero_centered_gamma) {
  RETURN_IF_ERROR(CheckBackward(dy, x, nullptr, rsigma, gamma, ctx));
  ScopedKernelTimer timer(ctx, KernelOp::kRmsNormBackward);
  return Dispatch("RmsNormBackward", ctx,
                  [&] { return cpu::RmsNormBackward(ctx, dy, x, rsigma, gamma, zero_centered_gamma); },
                  TESERVE_CUDA_KERNEL([&] {
                    NormBackwardOptions options;
                    options.zero_centered_gamma = zero_centered_gamma;
                    return cuda::NormalizationBackward(ctx, NormType::kRmsNorm, dy, x, Tensor(), rsigma, gamma,
                                                       options);
                  }));
}

absl::StatusOr<NormForwardResult> NormalizationForward(const Context& ctx, NormType type,
                                                       const Tensor& x, const Tensor& gamma,
                                                       const Tensor& beta,
                                                       const NormForwardOptions& options) {
  RETURN_IF_ERROR(CheckInput("x", x, /*dtype=*/nullptr, ctx));
  RETURN_IF_ERROR(CheckFloatTensor("gamma", gamma, {x.dim(1)}, ctx));
  if (type == NormType::kLayerNorm) {
    RETURN_IF_ERROR(CheckFloatTensor("beta", beta, {x.dim(1)}, ctx));
  } else {
    RETURN_IF_ERROR(CheckAbsentForRmsNorm("beta", beta));
  }
  RETURN_IF_ERROR(CheckForwardOptions(options));
  if (options.mxfp8) {
    const Mxfp8QuantizeOptions& q = options.mxfp8_options;
    if (q.rowwise && x.dim(1) % kMxfp8BlockSize != 0) {
      return InvalidField("x.shape[1]", "a multiple of 32 for the rowwise MXFP8 copy", x.dim(1));
    }
    if (q.columnwise && x.dim(0) % kMxfp8BlockSize != 0) {
      return InvalidField("x.shape[0]", "a multiple of 32 for the columnwise MXFP8 copy", x.dim(0));
    }
  }
  ScopedKernelTimer timer(ctx, KernelOp::kNormalizationForward);
  if (!options.mxfp8) return DispatchForward("NormalizationForward", ctx, type, x, gamma, beta, options);
#if TESERVE_WITH_CUDA
  if (kFusedCudaNormMxfp8 && !ctx.device.is_cpu()) {
    ASSIGN_OR_RETURN(const bool fused, cuda::FusesMxfp8(type, x, gamma, beta, options));
    if (fused) return cuda::NormalizationForward(ctx, type, x, gamma, beta, options);
  }
#endif
  // MXFP8: the FP32 y, then QuantizeMxfp8 of it; y rounded to y_dtype when requested.
  NormForwardOptions norm = options;
  norm.mxfp8 = false;
  norm.write_y = true;
  norm.y_dtype = DType::kFloat32;
  ASSIGN_OR_RETURN(NormForwardResult result,
                   DispatchForward("NormalizationForward", ctx, type, x, gamma, beta, norm));
  ASSIGN_OR_RETURN(result.fp8, QuantizeMxfp8(ctx, result.y, options.mxfp8_options));
  const DType y_dtype = options.y_dtype.value_or(x.dtype());
  if (!options.write_y) {
    result.y = Tensor();
  } else if (y_dtype != DType::kFloat32) {
    ASSIGN_OR_RETURN(result.y, CastFromFloat32(ctx, result.y, y_dtype));
  }
  return result;
}

absl::StatusOr<NormBackwardOutputs> NormalizationBackward(const Context& ctx, NormType type,
                                                          const Tensor& dy, const Tensor& x,
                                                          const Tensor& mu, const Tensor& rsigma,
                                                          const Tensor& gamma,
                                                          const NormBackwardOptions& options) {
  RETURN_IF_ERROR(CheckInput("x", x, /*dtype=*/nullptr, ctx));
  const DType dtype = x.dtype();
  RETURN_IF_ERROR(CheckInput("dy", dy, &dtype, ctx));
  RETURN_IF_ERROR(CheckShape("dy", dy, x.shape()));
  const Shape rows{x.dim(0)};
  if (type == NormType::kLayerNorm) {
    RETURN_IF_ERROR(CheckFloatTensor("mu", mu, rows, ctx));
  } else {
    RETURN_IF_ERROR(CheckAbsentForRmsNorm("mu", mu));
  }
  RETURN_IF_ERROR(CheckFloatTensor("rsigma", rsigma, rows, ctx));
  RETURN_IF_ERROR(CheckFloatTensor("gamma", gamma, {x.dim(1)}, ctx));
  RETURN_IF_ERROR(CheckSmMargin("options.sm_margin", options.sm_margin));
  ScopedKernelTimer timer(ctx, KernelOp::kNormalizationBackward);
  return Dispatch("NormalizationBackward", ctx,
                  [&] { return cpu::NormalizationBackward(ctx, type, dy, x, mu, rsigma, gamma, options); },
                  TESERVE_CUDA_KERNEL([&] {
                    return cuda::NormalizationBackward(ctx, type, dy, x, mu, rsigma, gamma, options);
                  }));
}

}  // namespace kernels
}  // namespace teserve
