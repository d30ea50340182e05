// Checked entry points of kernels/block_quantize.h. Each validates tensor metadata
// (dtype, rank, shape, device, divisibility, options; errors name the argument and say
// expected vs got), then runs the CPU reference. There is no CUDA kernel for these
// ops yet: CUDA tensors are answered UNIMPLEMENTED after the metadata checks, so a
// caller learns about a malformed request first. Tensors must live on the Context's
// device; nothing here copies between devices.
#include "kernels/block_quantize.h"

#include <cmath>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "kernels/cpu/block_quantize_cpu.h"

namespace teserve {
namespace kernels {
namespace {

constexpr char kFp8Formats[] = "FLOAT8_E4M3 or FLOAT8_E5M2";
constexpr char kBlockModes[] = "one of mxfp8_1d, block_1d, block_2d";

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
int64_t RoundUp(int64_t a, int64_t b) { return CeilDiv(a, b) * b; }

absl::Status NoCudaKernel(absl::string_view op) {
  return absl::UnimplementedError(absl::StrCat("no CUDA kernel yet for ", op));
}

// Defined, of `dtype`, of `rank` and on the Context's device.
absl::Status CheckTensor(absl::string_view name, const Tensor& t, DType dtype, int rank,
                         const Context& ctx) {
  if (!t.defined()) return InvalidField(name, "a tensor", "an undefined tensor");
  if (t.dtype() != dtype) {
    return InvalidField(absl::StrCat(name, ".dtype"), DTypeName(dtype), DTypeName(t.dtype()));
  }
  if (t.rank() != rank) {
    return InvalidField(absl::StrCat(name, ".shape"), absl::StrCat("rank ", rank),
                        absl::StrCat(ShapeToString(t.shape()), " (rank ", t.rank(), ")"));
  }
  if (t.device() != ctx.device) {
    return InvalidField(absl::StrCat(name, ".device"), ctx.device.ToString(),
                        t.device().ToString());
  }
  return absl::OkStatus();
}

absl::Status CheckShape(absl::string_view name, const Tensor& t, const Shape& expected) {
  if (t.shape() == expected) return absl::OkStatus();
  return InvalidField(absl::StrCat(name, ".shape"), ShapeToString(expected),
                      ShapeToString(t.shape()));
}

absl::Status CheckCopies(absl::string_view field, DType format, bool rowwise, bool columnwise) {
  if (!IsFloat8(format)) {
    return InvalidField(absl::StrCat(field, ".format"), kFp8Formats, DTypeName(format));
  }
  if (!rowwise && !columnwise) return InvalidField(field, "rowwise and/or columnwise", "neither");
  return absl::OkStatus();
}

// MXFP8 blocks run along the copy's rows: x's columns (rowwise) or rows (columnwise).
absl::Status CheckMxfp8Divisible(const Tensor& x, const Mxfp8QuantizeOptions& options) {
  if (options.rowwise && x.dim(1) % kMxfp8BlockSize != 0) {
    return InvalidField("x.shape[1]", "a multiple of 32 for the rowwise MXFP8 copy", x.dim(1));
  }
  if (options.columnwise && x.dim(0) % kMxfp8BlockSize != 0) {
    return InvalidField("x.shape[0]", "a multiple of 32 for the columnwise MXFP8 copy", x.dim(0));
  }
  return absl::OkStatus();
}

absl::Status CheckEpsilon(float amax_epsilon) {
  if (std::isfinite(amax_epsilon) && amax_epsilon >= 0.0f) return absl::OkStatus();
  return InvalidField("options.amax_epsilon", "a finite value >= 0", amax_epsilon);
}

// Scale tensor dtype and shape of a copy [rows, cols] under `mode`.
DType ScaleDType(ScalingMode mode) {
  return mode == ScalingMode::kMxfp8_1D ? DType::kFloat8E8M0 : DType::kFloat32;
}

Shape ScaleShape(ScalingMode mode, int64_t rows, int64_t cols) {
  switch (mode) {
    case ScalingMode::kMxfp8_1D: return {rows, cols / kMxfp8BlockSize};
    case ScalingMode::kBlock2D:
      return {CeilDiv(rows, kFp8BlockScalingSize), CeilDiv(cols, kFp8BlockScalingSize)};
    default: return {rows, CeilDiv(cols, kFp8BlockScalingSize)};
  }
}

absl::Status CheckBlockCopy(const QuantizedTensor& q, Copy copy, const Context& ctx) {
  const ScalingMode mode = q.mode;
  if (mode != ScalingMode::kMxfp8_1D && mode != ScalingMode::kBlock1D &&
      mode != ScalingMode::kBlock2D) {
    return InvalidField("q.mode", kBlockModes, ScalingModeName(mode));
  }
  if (!IsFloat8(q.format)) return InvalidField("q.format", kFp8Formats, DTypeName(q.format));
  if (q.shape.size() != 2) return InvalidField("q.shape", "rank 2", ShapeToString(q.shape));
  const bool rowwise = copy == Copy::kRowwise;
  const char* data_name = rowwise ? "q.rowwise_data" : "q.columnwise_data";
  const char* scale_name = rowwise ? "q.rowwise_scale_inv" : "q.columnwise_scale_inv";
  const Tensor& data = rowwise ? q.rowwise_data : q.columnwise_data;
  const Tensor& scale_inv = rowwise ? q.rowwise_scale_inv : q.columnwise_scale_inv;
  const int64_t rows = rowwise ? q.rows() : q.cols();
  const int64_t cols = rowwise ? q.cols() : q.rows();
  RETURN_IF_ERROR(CheckTensor(data_name, data, q.format, 2, ctx));
  RETURN_IF_ERROR(CheckShape(data_name, data, {rows, cols}));
  if (mode == ScalingMode::kMxfp8_1D && cols % kMxfp8BlockSize != 0) {
    return InvalidField(absl::StrCat(data_name, ".shape[1]"), "a multiple of 32", cols);
  }
  RETURN_IF_ERROR(CheckTensor(scale_name, scale_inv, ScaleDType(mode), 2, ctx));
  return CheckShape(scale_name, scale_inv, ScaleShape(mode, rows, cols));
}

}  // namespace

absl::StatusOr<QuantizedTensor> QuantizeMxfp8(const Context& ctx, const Tensor& x,
                                              const Mxfp8QuantizeOptions& options) {
  RETURN_IF_ERROR(CheckTensor("x", x, DType::kFloat32, 2, ctx));
  RETURN_IF_ERROR(CheckCopies("options", options.format, options.rowwise, options.columnwise));
  RETURN_IF_ERROR(CheckMxfp8Divisible(x, options));
  if (!ctx.device.is_cpu()) return NoCudaKernel("QuantizeMxfp8");
  return cpu::QuantizeMxfp8(ctx, x, options);
}

absl::StatusOr<QuantizedTensor> QuantizeBlockScaling(const Context& ctx, const Tensor& x,
                                                     const BlockScalingQuantizeOptions& options) {
  RETURN_IF_ERROR(CheckTensor("x", x, DType::kFloat32, 2, ctx));
  RETURN_IF_ERROR(CheckCopies("options", options.format, options.rowwise, options.columnwise));
  RETURN_IF_ERROR(CheckEpsilon(options.amax_epsilon));
  if (!ctx.device.is_cpu()) return NoCudaKernel("QuantizeBlockScaling");
  return cpu::QuantizeBlockScaling(ctx, x, options);
}

absl::StatusOr<Tensor> DequantizeBlock(const Context& ctx, const QuantizedTensor& q, Copy copy) {
  RETURN_IF_ERROR(CheckBlockCopy(q, copy, ctx));
  if (!ctx.device.is_cpu()) return NoCudaKernel("DequantizeBlock");
  return cpu::DequantizeBlock(ctx, q, copy);
}

absl::StatusOr<Tensor> SwizzleMxfp8Scales(const Context& ctx, const Tensor& scales) {
  RETURN_IF_ERROR(CheckTensor("scales", scales, DType::kFloat8E8M0, 2, ctx));
  if (!ctx.device.is_cpu()) return NoCudaKernel("SwizzleMxfp8Scales");
  return cpu::SwizzleMxfp8Scales(ctx, scales);
}

absl::StatusOr<Tensor> UnswizzleMxfp8Scales(const Context& ctx, const Tensor& swizzled,
                                            int64_t rows, int64_t cols) {
  if (rows < 0) return InvalidField("rows", "a value >= 0", rows);
  if (cols < 0) return InvalidField("cols", "a value >= 0", cols);
  RETURN_IF_ERROR(CheckTensor("swizzled", swizzled, DType::kFloat8E8M0, 2, ctx));
  RETURN_IF_ERROR(
      CheckShape("swizzled", swizzled,
                 {RoundUp(rows, kMxfp8SwizzleTileRows), RoundUp(cols, kMxfp8SwizzleTileCols)}));
  if (!ctx.device.is_cpu()) return NoCudaKernel("UnswizzleMxfp8Scales");
  return cpu::UnswizzleMxfp8Scales(ctx, swizzled, rows, cols);
}

absl::StatusOr<Tensor> BlockScalesGemmLayout(const Context& ctx, const Tensor& scale_inv,
                                             bool two_d) {
  RETURN_IF_ERROR(CheckTensor("scale_inv", scale_inv, DType::kFloat32, 2, ctx));
  if (!ctx.device.is_cpu()) return NoCudaKernel("BlockScalesGemmLayout");
  return cpu::BlockScalesGemmLayout(ctx, scale_inv, two_d);
}

}  // namespace kernels
}  // namespace teserve
