// Checked entry points of kernels/cast.h. Each validates tensor metadata (dtype, rank,
// shape, device; errors name the argument and say expected vs got), then dispatches on
// the Context's device: kernels/cpu for the CPU, kernels/cuda when the CUDA backend is
// compiled in (TESERVE_WITH_CUDA from //tools/cuda:config). Tensors must live on the
// Context's device; nothing here copies between devices.
#include "kernels/cast.h"

#include <cmath>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "kernels/cpu/cast_cpu.h"
#include "kernels/dispatch.h"
#include "kernels/tensor_checks.h"
#include "kernels/timing.h"

#if TESERVE_WITH_CUDA
#include "kernels/cuda/cast/cast_cuda.h"
#endif

namespace teserve {
namespace kernels {
namespace {

constexpr char kCastTypes[] = "one of FLOAT32, FLOAT16, BFLOAT16, FLOAT8_E4M3, FLOAT8_E5M2";

bool IsCastType(DType dtype) { return IsHighPrecisionFloat(dtype) || IsFloat8(dtype); }

absl::Status CheckQuantizeOptions(const PerTensorQuantizeOptions& options) {
  RETURN_IF_ERROR(CheckFloat8("options.format", options.format));
  RETURN_IF_ERROR(CheckFinitePositive("options.scale", options.scale));
  if (options.current.has_value()) {
    const float epsilon = options.current->amax_epsilon;
    if (!(epsilon >= 0.0f) || !std::isfinite(epsilon)) {
      return InvalidField("options.current.amax_epsilon", "a finite value >= 0", epsilon);
    }
  }
  return CheckCopiesRequested("options", options.rowwise, options.columnwise);
}

// The optional fused-dbias output: FP32 [cols of x] on the Context's device.
absl::Status CheckDbias(const Tensor* dbias, const Tensor& x, const Context& ctx) {
  if (dbias == nullptr) return absl::OkStatus();
  return CheckTensorOfShape("options.dbias", *dbias, DType::kFloat32, {x.dim(1)}, ctx);
}

absl::Status CheckQuantizedCopy(const QuantizedTensor& q, Copy copy, const Context& ctx) {
  if (q.mode != ScalingMode::kPerTensor) {
    return InvalidField("q.mode", ScalingModeName(ScalingMode::kPerTensor), ScalingModeName(q.mode));
  }
  RETURN_IF_ERROR(CheckFloat8("q.format", q.format));
  if (q.shape.size() != 2) return InvalidField("q.shape", "rank 2", ShapeToString(q.shape));
  const QuantizedCopy c = SelectCopy(q, copy);
  RETURN_IF_ERROR(CheckTensor(c.data_name, c.data, q.format, 2, ctx));
  RETURN_IF_ERROR(CheckShape(c.data_name, c.data, {c.rows, c.cols}));
  RETURN_IF_ERROR(CheckTensor(c.scale_name, c.scale_inv, DType::kFloat32, 1, ctx));
  if (c.scale_inv.numel() != 1) {
    return InvalidField(absl::StrCat(c.scale_name, ".shape"), "[1]",
                        ShapeToString(c.scale_inv.shape()));
  }
  return absl::OkStatus();
}

// The source of an amax or a per-tensor quantization: FP32 or BF16 (BF16 converts to
// FP32 exactly, so both read the same values; the CUDA kernels read BF16 directly).
absl::Status CheckQuantizeSource(const Tensor& x, int rank, const Context& ctx) {
  RETURN_IF_ERROR(CheckDefined("x", x));
  if (x.dtype() != DType::kFloat32 && x.dtype() != DType::kBFloat16) {
    return InvalidField("x.dtype", "FLOAT32 or BFLOAT16", DTypeName(x.dtype()));
  }
  return CheckTensor("x", x, x.dtype(), rank, ctx);
}

}  // namespace

absl::StatusOr<float> Amax(const Context& ctx, const Tensor& x) {
  RETURN_IF_ERROR(CheckQuantizeSource(x, kAnyRank, ctx));
  ScopedKernelTimer timer(ctx, KernelOp::kAmax);
  return Dispatch(
      "Amax", ctx,
      [&]() -> absl::StatusOr<float> {
        if (x.dtype() == DType::kFloat32) return cpu::Amax(ctx, x);
        ASSIGN_OR_RETURN(Tensor x32, cpu::ToFloat32(ctx, x));  // exact
        return cpu::Amax(ctx, x32);
      },
      TESERVE_CUDA_KERNEL([&] { return cuda::Amax(ctx, x); }));
}

absl::StatusOr<QuantizedTensor> QuantizePerTensor(const Context& ctx, const Tensor& x,
                                                  const PerTensorQuantizeOptions& options) {
  RETURN_IF_ERROR(CheckQuantizeSource(x, 2, ctx));
  RETURN_IF_ERROR(CheckQuantizeOptions(options));
  RETURN_IF_ERROR(CheckDbias(options.dbias, x, ctx));
  ScopedKernelTimer timer(ctx, KernelOp::kQuantizePerTensor);
  return Dispatch(
      "QuantizePerTensor", ctx,
      [&]() -> absl::StatusOr<QuantizedTensor> {
        if (x.dtype() == DType::kFloat32) return cpu::QuantizePerTensor(ctx, x, options);
        ASSIGN_OR_RETURN(Tensor x32, cpu::ToFloat32(ctx, x));
        return cpu::QuantizePerTensor(ctx, x32, options);
      },
      TESERVE_CUDA_KERNEL([&] { return cuda::QuantizePerTensor(ctx, x, options); }));
}

absl::StatusOr<Tensor> Convert(const Context& ctx, const Tensor& x, DType dtype) {
  if (x.dtype() == dtype) return x;
  if (dtype == DType::kFloat32) return ToFloat32(ctx, x);
  if (x.dtype() == DType::kFloat32) return CastFromFloat32(ctx, x, dtype);
  ASSIGN_OR_RETURN(Tensor x32, ToFloat32(ctx, x));
  return CastFromFloat32(ctx, x32, dtype);
}

absl::StatusOr<Tensor> Dequantize(const Context& ctx, const QuantizedTensor& q, Copy copy) {
  RETURN_IF_ERROR(CheckQuantizedCopy(q, copy, ctx));
  ScopedKernelTimer timer(ctx, KernelOp::kDequantizePerTensor);
  return Dispatch("Dequantize", ctx, [&] { return cpu::Dequantize(ctx, q, copy); },
                  TESERVE_CUDA_KERNEL([&] { return cuda::Dequantize(ctx, q, copy); }));
}

absl::StatusOr<Tensor> ToFloat32(const Context& ctx, const Tensor& x) {
  RETURN_IF_ERROR(CheckDefined("x", x));
  if (!IsCastType(x.dtype())) return InvalidField("x.dtype", kCastTypes, DTypeName(x.dtype()));
  RETURN_IF_ERROR(CheckDevice("x", x, ctx));
  return Dispatch("ToFloat32", ctx, [&] { return cpu::ToFloat32(ctx, x); },
                  TESERVE_CUDA_KERNEL([&] { return cuda::ToFloat32(ctx, x); }));
}

absl::StatusOr<Tensor> CastFromFloat32(const Context& ctx, const Tensor& x, DType dtype) {
  RETURN_IF_ERROR(CheckTensor("x", x, DType::kFloat32, kAnyRank, ctx));
  if (!IsCastType(dtype)) return InvalidField("dtype", kCastTypes, DTypeName(dtype));
  return Dispatch("CastFromFloat32", ctx, [&] { return cpu::CastFromFloat32(ctx, x, dtype); },
                  TESERVE_CUDA_KERNEL([&] { return cuda::CastFromFloat32(ctx, x, dtype); }));
}

}  // namespace kernels
}  // namespace teserve
