// Checked entry points of kernels/activation.h: validate metadata (rank-2 x of FP32, or
// FP32/FP16/BF16 for the fused entry points, even width for gated kinds, dy shaped like
// the output, clamped_swiglu params finite and > 0, options, devices; errors name the
// argument and say expected vs got), then dispatch on the Context's device: kernels/cpu
// for the CPU, kernels/cuda when the CUDA backend is compiled in (TESERVE_WITH_CUDA).
#include "kernels/activation.h"

#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/status.h"
#include "kernels/cpu/activation_cpu.h"
#include "kernels/dispatch.h"
#include "kernels/tensor_checks.h"
#include "kernels/timing.h"

#if TESERVE_WITH_CUDA
#include "kernels/cuda/activation/activation_cuda.h"
#endif

namespace teserve {
namespace kernels {
namespace {

struct NamedActivation {
  Activation kind;
  absl::string_view name;
  bool gated;
};

constexpr NamedActivation kActivations[] = {
    {Activation::kGelu, "gelu", false},     {Activation::kGeglu, "geglu", true},
    {Activation::kQgelu, "qgelu", false},   {Activation::kQgeglu, "qgeglu", true},
    {Activation::kRelu, "relu", false},     {Activation::kReglu, "reglu", true},
    {Activation::kSrelu, "srelu", false},   {Activation::kSreglu, "sreglu", true},
    {Activation::kSilu, "silu", false},     {Activation::kSwiglu, "swiglu", true},
    {Activation::kClampedSwiglu, "clamped_swiglu", true},
};

const NamedActivation& Find(Activation kind) {
  for (const NamedActivation& a : kActivations) {
    if (a.kind == kind) return a;
  }
  return kActivations[0];  // unreachable: every enumerator is listed
}

absl::Status CheckParams(Activation kind, const ActivationParams& params) {
  if (kind != Activation::kClampedSwiglu) return absl::OkStatus();
  RETURN_IF_ERROR(CheckFinitePositive("params.limit", params.limit));
  return CheckFinitePositive("params.alpha", params.alpha);
}

absl::Status CheckGatedWidth(Activation kind, const Tensor& x) {
  if (IsGated(kind) && x.dim(1) % 2 != 0) {
    return InvalidField("x.shape",
                        absl::StrCat("[rows, 2k] (", ActivationName(kind), " splits the last dimension in halves)"),
                        ShapeToString(x.shape()));
  }
  return absl::OkStatus();
}

// x: FP32 [rows, cols] with cols even for gated kinds.
absl::Status CheckInput(Activation kind, const Tensor& x, const Context& ctx) {
  RETURN_IF_ERROR(CheckTensor("x", x, DType::kFloat32, 2, ctx));
  return CheckGatedWidth(kind, x);
}

constexpr char kFloatTypes[] = "one of FLOAT32, FLOAT16, BFLOAT16";

// x: FP32, FP16 or BF16 [rows, cols] with cols even for gated kinds.
absl::Status CheckFusedInput(Activation kind, const Tensor& x, const Context& ctx) {
  RETURN_IF_ERROR(CheckDefined("x", x));
  if (x.rank() != 2) return InvalidField("x.shape", "[rows, cols]", ShapeToString(x.shape()));
  if (!IsHighPrecisionFloat(x.dtype())) return InvalidField("x.dtype", kFloatTypes, DTypeName(x.dtype()));
  RETURN_IF_ERROR(CheckDevice("x", x, ctx));
  return CheckGatedWidth(kind, x);
}

int64_t OutputWidth(Activation kind, const Tensor& x) { return IsGated(kind) ? x.dim(1) / 2 : x.dim(1); }

absl::Status CheckForwardOptions(const ActivationForwardOptions& options) {
  if (options.y_dtype.has_value() && !IsHighPrecisionFloat(*options.y_dtype)) {
    return InvalidField("options.y_dtype", kFloatTypes, DTypeName(*options.y_dtype));
  }
  if (!options.write_y && !options.quantize) {
    return InvalidField("options.write_y", "true when options.quantize is false", "false");
  }
  if (options.quantize) {
    const PerTensorQuantizeOptions& q = options.quantize_options;
    RETURN_IF_ERROR(CheckFloat8("options.quantize_options.format", q.format));
    RETURN_IF_ERROR(CheckFinitePositive("options.quantize_options.scale", q.scale));
    RETURN_IF_ERROR(CheckCopiesRequested("options.quantize_options", q.rowwise, q.columnwise));
  }
  return absl::OkStatus();
}

}  // namespace

absl::string_view ActivationName(Activation kind) { return Find(kind).name; }

bool IsGated(Activation kind) { return Find(kind).gated; }

std::string ActivationNames() {
  return absl::StrJoin(kActivations, ", ",
                       [](std::string* out, const NamedActivation& a) { absl::StrAppend(out, a.name); });
}

absl::StatusOr<Activation> ParseActivation(absl::string_view name, absl::string_view field) {
  for (const NamedActivation& a : kActivations) {
    if (a.name == name) return a.kind;
  }
  return InvalidField(field, absl::StrCat("one of ", ActivationNames()), absl::StrCat("'", name, "'"));
}

absl::StatusOr<Tensor> ActivationForward(const Context& ctx, Activation kind, const ActivationParams& params,
                                         const Tensor& x) {
  RETURN_IF_ERROR(CheckInput(kind, x, ctx));
  RETURN_IF_ERROR(CheckParams(kind, params));
  ScopedKernelTimer timer(ctx, KernelOp::kActivationForward);
  return Dispatch("ActivationForward", ctx, [&] { return cpu::ActivationForward(ctx, kind, params, x); },
                  TESERVE_CUDA_KERNEL([&]() -> absl::StatusOr<Tensor> {
                    ActivationForwardOptions options;  // the fused kernel writing an FP32 y only
                    options.y_dtype = DType::kFloat32;
                    ASSIGN_OR_RETURN(ActivationForwardResult result,
                                     cuda::FusedActivationForward(ctx, kind, params, x, options));
                    return std::move(result.y);
                  }));
}

absl::StatusOr<Tensor> ActivationBackward(const Context& ctx, Activation kind, const ActivationParams& params,
                                          const Tensor& dy, const Tensor& x) {
  RETURN_IF_ERROR(CheckInput(kind, x, ctx));
  RETURN_IF_ERROR(CheckTensorOfShape("dy", dy, DType::kFloat32,
                                     {x.dim(0), IsGated(kind) ? x.dim(1) / 2 : x.dim(1)}, ctx));
  RETURN_IF_ERROR(CheckParams(kind, params));
  ScopedKernelTimer timer(ctx, KernelOp::kActivationBackward);
  return Dispatch("ActivationBackward", ctx, [&] { return cpu::ActivationBackward(ctx, kind, params, dy, x); },
                  TESERVE_CUDA_KERNEL([&]() -> absl::StatusOr<Tensor> {
                    ASSIGN_OR_RETURN(ActivationBackwardResult result,
                                     cuda::FusedActivationBackward(ctx, kind, params, dy, x,
                                                                   ActivationBackwardOptions()));
                    return std::move(result.dx);
                  }));
}

absl::StatusOr<ActivationForwardResult> FusedActivationForward(const Context& ctx, Activation kind,
                                                               const ActivationParams& params,
                                                               const Tensor& x,
                                                               const ActivationForwardOptions& options) {
  RETURN_IF_ERROR(CheckFusedInput(kind, x, ctx));
  RETURN_IF_ERROR(CheckParams(kind, params));
  RETURN_IF_ERROR(CheckForwardOptions(options));
  ScopedKernelTimer timer(ctx, KernelOp::kActivationForward);
  return Dispatch("FusedActivationForward", ctx,
                  [&] { return cpu::FusedActivationForward(ctx, kind, params, x, options); },
                  TESERVE_CUDA_KERNEL([&] { return cuda::FusedActivationForward(ctx, kind, params, x, options); }));
}

absl::StatusOr<ActivationBackwardResult> FusedActivationBackward(const Context& ctx, Activation kind,
                                                                 const ActivationParams& params,
                                                                 const Tensor& dy, const Tensor& x,
                                                                 const ActivationBackwardOptions& options) {
  RETURN_IF_ERROR(CheckFusedInput(kind, x, ctx));
  RETURN_IF_ERROR(CheckTensorOfShape("dy", dy, x.dtype(), {x.dim(0), OutputWidth(kind, x)}, ctx));
  RETURN_IF_ERROR(CheckParams(kind, params));
  ScopedKernelTimer timer(ctx, KernelOp::kActivationBackward);
  return Dispatch("FusedActivationBackward", ctx,
                  [&] { return cpu::FusedActivationBackward(ctx, kind, params, dy, x, options); },
                  TESERVE_CUDA_KERNEL([&] {
                    return cuda::FusedActivationBackward(ctx, kind, params, dy, x, options);
                  }));
}

}  // namespace kernels
}  // namespace teserve
