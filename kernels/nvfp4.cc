// Checked entry points of kernels/nvfp4.h. Each validates tensor metadata and options
// (errors name the argument and say expected vs got), then dispatches on the Context's
// device. Only the CPU reference exists: CUDA tensors get UNIMPLEMENTED until the
// kernels land, rather than a silent host round trip.
#include "kernels/nvfp4.h"

#include <cmath>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "kernels/cpu/nvfp4_cpu.h"

namespace teserve {
namespace kernels {
namespace {

absl::Status NoCudaKernel(absl::string_view op) {
  return absl::UnimplementedError(absl::StrCat("no CUDA kernel yet for ", op));
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
  if (t.device() != ctx.device) {
    return InvalidField(absl::StrCat(name, ".device"), ctx.device.ToString(),
                        t.device().ToString());
  }
  return absl::OkStatus();
}

absl::Status CheckBlockedDim(absl::string_view name, int64_t extent) {
  if (extent % kNvfp4BlockSize == 0) return absl::OkStatus();
  return InvalidField(name, "a multiple of 16 (NVFP4 blocks run along it)", extent);
}

absl::Status CheckQuantizeArgs(const Tensor& x, const Nvfp4QuantizeOptions& options,
                               const Context& ctx) {
  RETURN_IF_ERROR(CheckTensor("x", x, DType::kFloat32, 2, ctx));
  if (!options.rowwise && !options.columnwise) {
    return InvalidField("options", "rowwise and/or columnwise", "neither");
  }
  if (options.two_d && options.random_hadamard) {
    return InvalidField("options.random_hadamard",
                        "false with two_d (RHT is for 1D wgrad operands; 2D copies must agree)",
                        "true");
  }
  if (options.rowwise || options.two_d) RETURN_IF_ERROR(CheckBlockedDim("x.shape[1]", x.dim(1)));
  if (options.columnwise || options.two_d) RETURN_IF_ERROR(CheckBlockedDim("x.shape[0]", x.dim(0)));
  return absl::OkStatus();
}

absl::Status CheckQuantizedCopy(const QuantizedTensor& q, Copy copy, const Context& ctx) {
  if (q.mode != ScalingMode::kNvfp4_1D && q.mode != ScalingMode::kNvfp4_2D) {
    return InvalidField("q.mode", "nvfp4_1d or nvfp4_2d", ScalingModeName(q.mode));
  }
  if (q.format != DType::kFloat4E2M1) {
    return InvalidField("q.format", DTypeName(DType::kFloat4E2M1), DTypeName(q.format));
  }
  if (q.shape.size() != 2) return InvalidField("q.shape", "rank 2", ShapeToString(q.shape));
  if (!(q.global_encode_scale > 0.0f) || !std::isfinite(q.global_encode_scale)) {
    return InvalidField("q.global_encode_scale", "a finite positive value", q.global_encode_scale);
  }
  const bool rowwise = copy == Copy::kRowwise;
  const bool two_d = q.mode == ScalingMode::kNvfp4_2D;
  const int64_t rows = rowwise ? q.rows() : q.cols();  // of the copy
  const int64_t cols = rowwise ? q.cols() : q.rows();
  RETURN_IF_ERROR(CheckBlockedDim(rowwise ? "q.shape[1]" : "q.shape[0]", cols));
  if (two_d) RETURN_IF_ERROR(CheckBlockedDim(rowwise ? "q.shape[0]" : "q.shape[1]", rows));
  const char* data_name = rowwise ? "q.rowwise_data" : "q.columnwise_data";
  const char* scale_name = rowwise ? "q.rowwise_scale_inv" : "q.columnwise_scale_inv";
  const Tensor& data = rowwise ? q.rowwise_data : q.columnwise_data;
  const Tensor& scales = rowwise ? q.rowwise_scale_inv : q.columnwise_scale_inv;
  RETURN_IF_ERROR(CheckTensor(data_name, data, DType::kFloat4E2M1, 2, ctx));
  if (data.shape() != Shape{rows, cols}) {
    return InvalidField(absl::StrCat(data_name, ".shape"), ShapeToString({rows, cols}),
                        ShapeToString(data.shape()));
  }
  RETURN_IF_ERROR(CheckTensor(scale_name, scales, DType::kFloat8E4M3, 2, ctx));
  const Shape scale_shape = {two_d ? rows / kNvfp4BlockSize : rows, cols / kNvfp4BlockSize};
  if (scales.shape() != scale_shape) {
    return InvalidField(absl::StrCat(scale_name, ".shape"), ShapeToString(scale_shape),
                        ShapeToString(scales.shape()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<QuantizedTensor> QuantizeNvfp4(const Context& ctx, const Tensor& x,
                                              const Nvfp4QuantizeOptions& options) {
  RETURN_IF_ERROR(CheckQuantizeArgs(x, options, ctx));
  if (!ctx.device.is_cpu()) return NoCudaKernel("QuantizeNvfp4");
  return cpu::QuantizeNvfp4(ctx, x, options);
}

absl::StatusOr<Tensor> DequantizeNvfp4(const Context& ctx, const QuantizedTensor& q, Copy copy) {
  RETURN_IF_ERROR(CheckQuantizedCopy(q, copy, ctx));
  if (!ctx.device.is_cpu()) return NoCudaKernel("DequantizeNvfp4");
  return cpu::DequantizeNvfp4(ctx, q, copy);
}

absl::StatusOr<Tensor> CastToFloat4E2M1(const Context& ctx, const Tensor& x) {
  RETURN_IF_ERROR(CheckTensor("x", x, DType::kFloat32, -1, ctx));
  if (!ctx.device.is_cpu()) return NoCudaKernel("CastToFloat4E2M1");
  return cpu::CastToFloat4E2M1(ctx, x);
}

absl::StatusOr<Tensor> Float4E2M1ToFloat32(const Context& ctx, const Tensor& packed) {
  RETURN_IF_ERROR(CheckTensor("packed", packed, DType::kFloat4E2M1, -1, ctx));
  if (!ctx.device.is_cpu()) return NoCudaKernel("Float4E2M1ToFloat32");
  return cpu::Float4E2M1ToFloat32(ctx, packed);
}

}  // namespace kernels
}  // namespace teserve
