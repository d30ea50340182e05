// Checked entry points of kernels/block_quantize.h. Each validates tensor metadata
// (dtype, rank, shape, device, divisibility, options; errors name the argument and say
// expected vs got), then dispatches on the Context's device: kernels/cpu for the CPU,
// kernels/cuda when the CUDA backend is compiled in (TESERVE_WITH_CUDA from
// //tools/cuda:config); without it CUDA tensors get UNIMPLEMENTED. Tensors must
// live on the Context's device; nothing here copies between devices.
#include "kernels/block_quantize.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "kernels/cpu/block_math.h"
#include "kernels/cpu/block_quantize_cpu.h"
#include "kernels/cpu/cast_cpu.h"
#include "kernels/dispatch.h"
#include "kernels/tensor_checks.h"
#include "kernels/timing.h"

#if TESERVE_WITH_CUDA
#include "kernels/cuda/block_quantize/block_quantize_cuda.h"
#endif

namespace teserve {
namespace kernels {
namespace {

using cpu::CeilDiv;
using cpu::RoundUp;

constexpr char kBlockModes[] = "one of mxfp8_1d, block_1d, block_2d";

absl::Status CheckCopies(absl::string_view field, DType format, bool rowwise, bool columnwise) {
  RETURN_IF_ERROR(CheckFloat8(absl::StrCat(field, ".format"), format));
  return CheckCopiesRequested(field, rowwise, columnwise);
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

// The optional fused-dbias output: FP32 [cols of x] on the Context's device.
absl::Status CheckDbias(const Tensor* dbias, const Tensor& x, const Context& ctx) {
  if (dbias == nullptr) return absl::OkStatus();
  return CheckTensorOfShape("options.dbias", *dbias, DType::kFloat32, {x.dim(1)}, ctx);
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
  RETURN_IF_ERROR(CheckFloat8("q.format", q.format));
  if (q.shape.size() != 2) return InvalidField("q.shape", "rank 2", ShapeToString(q.shape));
  const QuantizedCopy c = SelectCopy(q, copy);
  RETURN_IF_ERROR(CheckTensor(c.data_name, c.data, q.format, 2, ctx));
  RETURN_IF_ERROR(CheckShape(c.data_name, c.data, {c.rows, c.cols}));
  if (mode == ScalingMode::kMxfp8_1D && c.cols % kMxfp8BlockSize != 0) {
    return InvalidField(absl::StrCat(c.data_name, ".shape[1]"), "a multiple of 32", c.cols);
  }
  RETURN_IF_ERROR(CheckTensor(c.scale_name, c.scale_inv, ScaleDType(mode), 2, ctx));
  return CheckShape(c.scale_name, c.scale_inv, ScaleShape(mode, c.rows, c.cols));
}

}  // namespace

absl::StatusOr<QuantizedTensor> QuantizeMxfp8(const Context& ctx, const Tensor& x,
                                              const Mxfp8QuantizeOptions& options) {
  RETURN_IF_ERROR(CheckTensor("x", x, DType::kFloat32, 2, ctx));
  RETURN_IF_ERROR(CheckCopies("options", options.format, options.rowwise, options.columnwise));
  RETURN_IF_ERROR(CheckMxfp8Divisible(x, options));
  RETURN_IF_ERROR(CheckDbias(options.dbias, x, ctx));
  ScopedKernelTimer timer(ctx, KernelOp::kQuantizeMxfp8);
  return Dispatch("QuantizeMxfp8", ctx, [&] { return cpu::QuantizeMxfp8(ctx, x, options); },
                  TESERVE_CUDA_KERNEL([&] { return cuda::QuantizeMxfp8(ctx, x, options); }));
}

absl::StatusOr<QuantizedTensor> QuantizeBlockScaling(const Context& ctx, const Tensor& x,
                                                     const BlockScalingQuantizeOptions& options) {
  RETURN_IF_ERROR(CheckTensor("x", x, DType::kFloat32, 2, ctx));
  RETURN_IF_ERROR(CheckCopies("options", options.format, options.rowwise, options.columnwise));
  RETURN_IF_ERROR(CheckFiniteNonNegative("options.amax_epsilon", options.amax_epsilon));
  RETURN_IF_ERROR(CheckDbias(options.dbias, x, ctx));
  ScopedKernelTimer timer(ctx, KernelOp::kQuantizeBlock);
  return Dispatch("QuantizeBlockScaling", ctx, [&] { return cpu::QuantizeBlockScaling(ctx, x, options); },
                  TESERVE_CUDA_KERNEL([&] { return cuda::QuantizeBlockScaling(ctx, x, options); }));
}

absl::StatusOr<Tensor> DequantizeBlock(const Context& ctx, const QuantizedTensor& q, Copy copy, DType out_dtype) {
  RETURN_IF_ERROR(CheckBlockCopy(q, copy, ctx));
  RETURN_IF_ERROR(CheckDequantizeOutput(out_dtype));
  ScopedKernelTimer timer(ctx, KernelOp::kDequantizeBlock);
  return Dispatch(
      "DequantizeBlock", ctx,
      [&]() -> absl::StatusOr<Tensor> {
        ASSIGN_OR_RETURN(Tensor out, cpu::DequantizeBlock(ctx, q, copy));
        if (out_dtype == DType::kFloat32) return out;
        return cpu::CastFromFloat32(ctx, out, out_dtype);
      },
      TESERVE_CUDA_KERNEL([&] { return cuda::DequantizeBlock(ctx, q, copy, out_dtype); }));
}

absl::StatusOr<Tensor> SwizzleMxfp8Scales(const Context& ctx, const Tensor& scales) {
  RETURN_IF_ERROR(CheckTensor("scales", scales, DType::kFloat8E8M0, 2, ctx));
  return Dispatch("SwizzleMxfp8Scales", ctx, [&] { return cpu::SwizzleMxfp8Scales(ctx, scales); },
                  TESERVE_CUDA_KERNEL([&] { return cuda::SwizzleMxfp8Scales(ctx, scales); }));
}

absl::StatusOr<Tensor> UnswizzleMxfp8Scales(const Context& ctx, const Tensor& swizzled,
                                            int64_t rows, int64_t cols) {
  if (rows < 0) return InvalidField("rows", "a value >= 0", rows);
  if (cols < 0) return InvalidField("cols", "a value >= 0", cols);
  RETURN_IF_ERROR(CheckTensor("swizzled", swizzled, DType::kFloat8E8M0, 2, ctx));
  RETURN_IF_ERROR(
      CheckShape("swizzled", swizzled,
                 {RoundUp(rows, kMxfp8SwizzleTileRows), RoundUp(cols, kMxfp8SwizzleTileCols)}));
  return Dispatch("UnswizzleMxfp8Scales", ctx, [&] { return cpu::UnswizzleMxfp8Scales(ctx, swizzled, rows, cols); },
                  TESERVE_CUDA_KERNEL([&] { return cuda::UnswizzleMxfp8Scales(ctx, swizzled, rows, cols); }));
}

absl::StatusOr<Tensor> BlockScalesGemmLayout(const Context& ctx, const Tensor& scale_inv,
                                             bool two_d) {
  RETURN_IF_ERROR(CheckTensor("scale_inv", scale_inv, DType::kFloat32, 2, ctx));
  return Dispatch("BlockScalesGemmLayout", ctx, [&] { return cpu::BlockScalesGemmLayout(ctx, scale_inv, two_d); },
                  TESERVE_CUDA_KERNEL([&] { return cuda::BlockScalesGemmLayout(ctx, scale_inv, two_d); }));
}

}  // namespace kernels
}  // namespace teserve
