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

#if TESERVE_WITH_CUDA
#include "kernels/cuda/cast_cuda.h"
#endif

namespace teserve {
namespace kernels {
namespace {

constexpr char kCastTypes[] = "one of FLOAT32, FLOAT16, BFLOAT16, FLOAT8_E4M3, FLOAT8_E5M2";
constexpr char kFp8Formats[] = "FLOAT8_E4M3 or FLOAT8_E5M2";

bool IsCastType(DType dtype) { return IsHighPrecisionFloat(dtype) || IsFloat8(dtype); }

absl::Status CheckDevice(absl::string_view name, const Tensor& t, const Context& ctx) {
  if (t.device() == ctx.device) return absl::OkStatus();
  return InvalidField(absl::StrCat(name, ".device"), ctx.device.ToString(), t.device().ToString());
}

// Defined, of `dtype`, of `rank` (-1: any) and on the Context's device.
absl::Status CheckTensor(absl::string_view name, const Tensor& t, DType dtype, int rank,
                         const Context& ctx) {
  if (!t.defined()) return InvalidField(name, "a tensor", "an undefined tensor");
  if (t.dtype() != dtype) {
    return InvalidField(absl::StrCat(name, ".dtype"), DTypeName(dtype), DTypeName(t.dtype()));
  }
  if (rank >= 0 && t.rank() != rank) {
    return InvalidField(absl::StrCat(name, ".shape"), absl::StrCat("rank ", rank),
                        absl::StrCat(ShapeToString(t.shape()), " (rank ", t.rank(), ")"));
  }
  return CheckDevice(name, t, ctx);
}

absl::Status CheckQuantizeOptions(const PerTensorQuantizeOptions& options) {
  if (!IsFloat8(options.format)) {
    return InvalidField("options.format", kFp8Formats, DTypeName(options.format));
  }
  if (!std::isfinite(options.scale) || options.scale <= 0.0f) {
    return InvalidField("options.scale", "a finite positive value", options.scale);
  }
  if (!options.rowwise && !options.columnwise) {
    return InvalidField("options", "rowwise and/or columnwise", "neither");
  }
  return absl::OkStatus();
}

absl::Status CheckQuantizedCopy(const QuantizedTensor& q, Copy copy, const Context& ctx) {
  if (q.mode != ScalingMode::kPerTensor) {
    return InvalidField("q.mode", ScalingModeName(ScalingMode::kPerTensor), ScalingModeName(q.mode));
  }
  if (!IsFloat8(q.format)) return InvalidField("q.format", kFp8Formats, DTypeName(q.format));
  if (q.shape.size() != 2) return InvalidField("q.shape", "rank 2", ShapeToString(q.shape));
  const bool rowwise = copy == Copy::kRowwise;
  const char* data_name = rowwise ? "q.rowwise_data" : "q.columnwise_data";
  const char* scale_name = rowwise ? "q.rowwise_scale_inv" : "q.columnwise_scale_inv";
  const Tensor& data = rowwise ? q.rowwise_data : q.columnwise_data;
  const Tensor& scale_inv = rowwise ? q.rowwise_scale_inv : q.columnwise_scale_inv;
  RETURN_IF_ERROR(CheckTensor(data_name, data, q.format, 2, ctx));
  const Shape expected = rowwise ? Shape{q.rows(), q.cols()} : Shape{q.cols(), q.rows()};
  if (data.shape() != expected) {
    return InvalidField(absl::StrCat(data_name, ".shape"), ShapeToString(expected),
                        ShapeToString(data.shape()));
  }
  RETURN_IF_ERROR(CheckTensor(scale_name, scale_inv, DType::kFloat32, 1, ctx));
  if (scale_inv.numel() != 1) {
    return InvalidField(absl::StrCat(scale_name, ".shape"), "[1]", ShapeToString(scale_inv.shape()));
  }
  return absl::OkStatus();
}

#if !TESERVE_WITH_CUDA
absl::Status NoCudaBackend(absl::string_view op) {
  return absl::FailedPreconditionError(
      absl::StrCat(op, " on a CUDA device: teserve was built without CUDA"));
}
#endif

// The CUDA backend implements the quantization ops; plain conversions on the GPU are
// not written yet.
absl::Status NotOnCuda(absl::string_view op) {
  return absl::UnimplementedError(absl::StrCat(op, " is not implemented on CUDA devices yet"));
}

}  // namespace

absl::StatusOr<float> Amax(const Context& ctx, const Tensor& x) {
  RETURN_IF_ERROR(CheckTensor("x", x, DType::kFloat32, -1, ctx));
  if (ctx.device.is_cpu()) return cpu::Amax(ctx, x);
#if TESERVE_WITH_CUDA
  return cuda::Amax(ctx, x);
#else
  return NoCudaBackend("Amax");
#endif
}

absl::StatusOr<QuantizedTensor> QuantizePerTensor(const Context& ctx, const Tensor& x,
                                                  const PerTensorQuantizeOptions& options) {
  RETURN_IF_ERROR(CheckTensor("x", x, DType::kFloat32, 2, ctx));
  RETURN_IF_ERROR(CheckQuantizeOptions(options));
  if (ctx.device.is_cpu()) return cpu::QuantizePerTensor(ctx, x, options);
#if TESERVE_WITH_CUDA
  return cuda::QuantizePerTensor(ctx, x, options);
#else
  return NoCudaBackend("QuantizePerTensor");
#endif
}

absl::StatusOr<Tensor> Dequantize(const Context& ctx, const QuantizedTensor& q, Copy copy) {
  RETURN_IF_ERROR(CheckQuantizedCopy(q, copy, ctx));
  if (ctx.device.is_cpu()) return cpu::Dequantize(ctx, q, copy);
#if TESERVE_WITH_CUDA
  return cuda::Dequantize(ctx, q, copy);
#else
  return NoCudaBackend("Dequantize");
#endif
}

absl::StatusOr<Tensor> ToFloat32(const Context& ctx, const Tensor& x) {
  if (!x.defined()) return InvalidField("x", "a tensor", "an undefined tensor");
  if (!IsCastType(x.dtype())) return InvalidField("x.dtype", kCastTypes, DTypeName(x.dtype()));
  RETURN_IF_ERROR(CheckDevice("x", x, ctx));
  if (ctx.device.is_cpu()) return cpu::ToFloat32(ctx, x);
  return NotOnCuda("ToFloat32");
}

absl::StatusOr<Tensor> CastFromFloat32(const Context& ctx, const Tensor& x, DType dtype) {
  RETURN_IF_ERROR(CheckTensor("x", x, DType::kFloat32, -1, ctx));
  if (!IsCastType(dtype)) return InvalidField("dtype", kCastTypes, DTypeName(dtype));
  if (ctx.device.is_cpu()) return cpu::CastFromFloat32(ctx, x, dtype);
  return NotOnCuda("CastFromFloat32");
}

}  // namespace kernels
}  // namespace teserve
