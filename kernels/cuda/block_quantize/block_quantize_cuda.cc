// Host side of the CUDA block-scaled FP8 ops: checks what the launchers rely on,
// allocates outputs on the source's device, launches block_quantize_kernels.cu on
// ctx.stream and turns CUDA errors into Status.
#include "kernels/cuda/block_quantize/block_quantize_cuda.h"

#include <cuda_runtime_api.h>

#include <cfloat>
#include <cstdint>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "kernels/cuda/cast/cast_cuda.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_entry.h"
#include "kernels/cuda/cuda_tensor_checks.h"
#include "kernels/cuda/scoped_device.h"

namespace teserve {
namespace kernels {
namespace cuda {
namespace {

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
int64_t RoundUp(int64_t a, int64_t b) { return CeilDiv(a, b) * b; }

struct CopyShapes {
  Shape rowwise_scale;
  Shape columnwise_scale;
};

// Allocates the requested copies (data and scale_inv) on x's device, zero-filled on
// ctx's stream, and points the launch parameters at them.
absl::Status AllocateCopies(const Context& ctx, const Tensor& x, DType format, DType scale_dtype,
                            const CopyShapes& shapes, bool rowwise, bool columnwise,
                            QuantizedTensor& q, BlockQuantizeLaunchParams& p) {
  const int64_t rows = x.dim(0);
  const int64_t cols = x.dim(1);
  if (rowwise) {
    ASSIGN_OR_RETURN(q.rowwise_data, Tensor::Empty(format, {rows, cols}, x.device(), ctx.stream));
    ASSIGN_OR_RETURN(q.rowwise_scale_inv,
                     Tensor::ZerosOn(scale_dtype, shapes.rowwise_scale, x.device(), ctx.stream));
    p.rowwise = q.rowwise_data.data<uint8_t>();
    p.rowwise_scale_inv = q.rowwise_scale_inv.raw_data();
  }
  if (columnwise) {
    ASSIGN_OR_RETURN(q.columnwise_data, Tensor::Empty(format, {cols, rows}, x.device(), ctx.stream));
    ASSIGN_OR_RETURN(q.columnwise_scale_inv,
                     Tensor::ZerosOn(scale_dtype, shapes.columnwise_scale, x.device(), ctx.stream));
    p.columnwise = q.columnwise_data.data<uint8_t>();
    p.columnwise_scale_inv = q.columnwise_scale_inv.raw_data();
  }
  return absl::OkStatus();
}

// The optional dbias output: FP32 [cols] on x's device.
absl::Status CheckDbias(const Tensor* dbias, const Tensor& x) {
  if (dbias == nullptr) return absl::OkStatus();
  RETURN_IF_ERROR(CheckOnCudaDevice("options.dbias", *dbias));
  if (dbias->dtype() != DType::kFloat32 || dbias->shape() != Shape{x.dim(1)} ||
      dbias->device() != x.device()) {
    return InvalidField("options.dbias",
                        absl::StrCat("FLOAT32 [", x.dim(1), "] on ", x.device().ToString()),
                        absl::StrCat(DTypeName(dbias->dtype()), " ",
                                     ShapeToString(dbias->shape()), " on ",
                                     dbias->device().ToString()));
  }
  return absl::OkStatus();
}

// Runs the launch (with the dbias workspace when dbias is asked for) and fills q.amax, or
// leaves it on the device in q.amax_bits (defer_amax).
absl::StatusOr<QuantizedTensor> Run(const Context& ctx, const Tensor& x, Tensor* dbias, bool defer_amax,
                                    BlockQuantizeLaunchParams& p, QuantizedTensor q) {
  ASSIGN_OR_RETURN(Tensor amax_bits, Tensor::ZerosOn(DType::kInt32, {1}, x.device(), ctx.stream));
  p.amax_bits = amax_bits.data<uint32_t>();
  Tensor workspace;
  if (dbias != nullptr) {
    p.dbias = dbias->data<float>();
    const int64_t slabs = BlockQuantizeDbiasSlabs(p);
    if (slabs > 0) {
      ASSIGN_OR_RETURN(workspace, Tensor::ZerosOn(DType::kFloat32, {slabs, p.cols}, x.device(), ctx.stream));
      p.dbias_workspace = workspace.data<float>();
    }
  }
  const cudaStream_t stream = StreamOf(ctx);
  TESERVE_CUDA_RETURN_IF_ERROR(LaunchBlockQuantize(p, stream));
  // The workspace and amax word are freed in stream order, after the kernels that use them.
  if (defer_amax) {
    q.amax_bits = std::move(amax_bits);
    return q;
  }
  ASSIGN_OR_RETURN(q.amax, ReadAmaxBits(p.amax_bits, stream));
  return q;
}

absl::Status CheckRequested(bool rowwise, bool columnwise) {
  if (rowwise || columnwise) return absl::OkStatus();
  return InvalidField("options", "rowwise or columnwise requested", "neither");
}

}  // namespace

absl::StatusOr<QuantizedTensor> QuantizeMxfp8(const Context& ctx, const Tensor& x,
                                              const Mxfp8QuantizeOptions& options,
                                              Fp8Encoder encoder) {
  ASSIGN_OR_RETURN(const SourceType type, CheckSource(x));
  ASSIGN_OR_RETURN(const Fp8Format format, Fp8FormatOf("options.format", options.format));
  RETURN_IF_ERROR(CheckRequested(options.rowwise, options.columnwise));
  RETURN_IF_ERROR(CheckDbias(options.dbias, x));
  const int64_t rows = x.dim(0);
  const int64_t cols = x.dim(1);
  if (options.rowwise && cols % kMxfp8BlockSize != 0) {
    return InvalidField("x.shape[1]", "a multiple of 32 for the rowwise MXFP8 copy", cols);
  }
  if (options.columnwise && rows % kMxfp8BlockSize != 0) {
    return InvalidField("x.shape[0]", "a multiple of 32 for the columnwise MXFP8 copy", rows);
  }
  ASSIGN_OR_RETURN(const ScopedDevice device, EnterDevice(x.device().index));

  QuantizedTensor q;
  q.shape = {rows, cols};
  q.format = options.format;
  q.mode = ScalingMode::kMxfp8_1D;
  BlockQuantizeLaunchParams p;
  p.x = x.raw_data();
  p.type = type;
  p.rows = rows;
  p.cols = cols;
  p.recipe = BlockRecipe::kMxfp8;
  p.format = format;
  p.encoder = encoder;
  const CopyShapes shapes{{rows, cols / kMxfp8BlockSize}, {cols, rows / kMxfp8BlockSize}};
  RETURN_IF_ERROR(AllocateCopies(ctx, x, options.format, DType::kFloat8E8M0, shapes, options.rowwise,
                                 options.columnwise, q, p));
  return Run(ctx, x, options.dbias, options.defer_amax, p, std::move(q));
}

absl::StatusOr<QuantizedTensor> QuantizeBlockScaling(const Context& ctx, const Tensor& x,
                                                     const BlockScalingQuantizeOptions& options,
                                                     Fp8Encoder encoder) {
  ASSIGN_OR_RETURN(const SourceType type, CheckSource(x));
  ASSIGN_OR_RETURN(const Fp8Format format, Fp8FormatOf("options.format", options.format));
  RETURN_IF_ERROR(CheckRequested(options.rowwise, options.columnwise));
  if (!(options.amax_epsilon >= 0.0f && options.amax_epsilon <= FLT_MAX)) {
    return InvalidField("options.amax_epsilon", "a finite value >= 0", options.amax_epsilon);
  }
  RETURN_IF_ERROR(CheckDbias(options.dbias, x));
  ASSIGN_OR_RETURN(const ScopedDevice device, EnterDevice(x.device().index));

  const int64_t rows = x.dim(0);
  const int64_t cols = x.dim(1);
  const int64_t row_blocks = CeilDiv(rows, kFp8BlockScalingSize);
  const int64_t col_blocks = CeilDiv(cols, kFp8BlockScalingSize);
  QuantizedTensor q;
  q.shape = {rows, cols};
  q.format = options.format;
  q.mode = options.two_d ? ScalingMode::kBlock2D : ScalingMode::kBlock1D;
  BlockQuantizeLaunchParams p;
  p.x = x.raw_data();
  p.type = type;
  p.rows = rows;
  p.cols = cols;
  p.recipe = options.two_d ? BlockRecipe::kBlock2D : BlockRecipe::kBlock1D;
  p.format = format;
  p.encoder = encoder;
  p.power_2_scale = options.power_2_scale;
  p.amax_epsilon = options.amax_epsilon;
  const CopyShapes shapes =
      options.two_d ? CopyShapes{{row_blocks, col_blocks}, {col_blocks, row_blocks}}
                    : CopyShapes{{rows, col_blocks}, {cols, row_blocks}};
  RETURN_IF_ERROR(AllocateCopies(ctx, x, options.format, DType::kFloat32, shapes, options.rowwise,
                                 options.columnwise, q, p));
  return Run(ctx, x, options.dbias, options.defer_amax, p, std::move(q));
}

absl::StatusOr<Tensor> DequantizeBlock(const Context& ctx, const QuantizedTensor& q, Copy copy, DType out_dtype) {
  const bool rowwise = copy == Copy::kRowwise;
  const Tensor& data = rowwise ? q.rowwise_data : q.columnwise_data;
  const Tensor& scale_inv = rowwise ? q.rowwise_scale_inv : q.columnwise_scale_inv;
  RETURN_IF_ERROR(CheckOnCudaDevice(rowwise ? "q.rowwise_data" : "q.columnwise_data", data));
  RETURN_IF_ERROR(
      CheckOnCudaDevice(rowwise ? "q.rowwise_scale_inv" : "q.columnwise_scale_inv", scale_inv));
  ASSIGN_OR_RETURN(const Fp8Format format, Fp8FormatOf("q.format", q.format));
  if (data.rank() != 2 || scale_inv.rank() != 2) {
    return InvalidField("q", "rank-2 data and scale_inv",
                        absl::StrCat(ShapeToString(data.shape()), " and ",
                                     ShapeToString(scale_inv.shape())));
  }
  const bool mxfp8 = q.mode == ScalingMode::kMxfp8_1D;
  ASSIGN_OR_RETURN(const ScopedDevice device, EnterDevice(data.device().index));
  // Every element is written.
  ASSIGN_OR_RETURN(Tensor out, Tensor::Empty(out_dtype, data.shape(), data.device(), ctx.stream));
  BlockDequantizeLaunchParams p;
  p.codes = data.data<uint8_t>();
  p.format = format;
  p.rows = data.dim(0);
  p.cols = data.dim(1);
  p.block_rows = q.mode == ScalingMode::kBlock2D ? kFp8BlockScalingSize : 1;
  p.block_cols = mxfp8 ? kMxfp8BlockSize : kFp8BlockScalingSize;
  p.scale_inv = scale_inv.raw_data();
  p.e8m0_scales = mxfp8;
  p.scale_cols = scale_inv.dim(1);
  p.out = out.raw_data();
  p.bf16_out = out_dtype == DType::kBFloat16;
  TESERVE_CUDA_RETURN_IF_ERROR(LaunchBlockDequantize(p, StreamOf(ctx)));
  return out;
}

absl::StatusOr<Tensor> SwizzleMxfp8Scales(const Context& ctx, const Tensor& scales) {
  RETURN_IF_ERROR(CheckOnCudaDevice("scales", scales));
  if (scales.dtype() != DType::kFloat8E8M0 || scales.rank() != 2) {
    return InvalidField("scales", "FLOAT8_E8M0 of rank 2",
                        absl::StrCat(DTypeName(scales.dtype()), " ", ShapeToString(scales.shape())));
  }
  ASSIGN_OR_RETURN(const ScopedDevice device, EnterDevice(scales.device().index));
  const int64_t rows = scales.dim(0);
  const int64_t cols = scales.dim(1);
  ASSIGN_OR_RETURN(Tensor out,
                   Tensor::ZerosOn(DType::kFloat8E8M0,
                                 {RoundUp(rows, kMxfp8SwizzleTileRows),
                                  RoundUp(cols, kMxfp8SwizzleTileCols)}, scales.device(), ctx.stream));
  TESERVE_CUDA_RETURN_IF_ERROR(LaunchSwizzleMxfp8Scales(
      scales.data<uint8_t>(), rows, cols, out.data<uint8_t>(), StreamOf(ctx)));
  return out;
}

absl::StatusOr<Tensor> UnswizzleMxfp8Scales(const Context& ctx, const Tensor& swizzled,
                                            int64_t rows, int64_t cols) {
  RETURN_IF_ERROR(CheckOnCudaDevice("swizzled", swizzled));
  const Shape expected = {RoundUp(rows, kMxfp8SwizzleTileRows),
                          RoundUp(cols, kMxfp8SwizzleTileCols)};
  if (rows < 0 || cols < 0 || swizzled.dtype() != DType::kFloat8E8M0 ||
      swizzled.shape() != expected) {
    return InvalidField("swizzled",
                        absl::StrCat("FLOAT8_E8M0 ", ShapeToString(expected)),
                        absl::StrCat(DTypeName(swizzled.dtype()), " ",
                                     ShapeToString(swizzled.shape())));
  }
  ASSIGN_OR_RETURN(const ScopedDevice device, EnterDevice(swizzled.device().index));
  ASSIGN_OR_RETURN(Tensor out, Tensor::ZerosOn(DType::kFloat8E8M0, {rows, cols}, swizzled.device(), ctx.stream));
  TESERVE_CUDA_RETURN_IF_ERROR(LaunchUnswizzleMxfp8Scales(
      swizzled.data<uint8_t>(), rows, cols, out.data<uint8_t>(), StreamOf(ctx)));
  return out;
}

absl::StatusOr<Tensor> BlockScalesGemmLayout(const Context& ctx, const Tensor& scale_inv,
                                             bool two_d) {
  RETURN_IF_ERROR(CheckOnCudaDevice("scale_inv", scale_inv));
  if (scale_inv.dtype() != DType::kFloat32 || scale_inv.rank() != 2) {
    return InvalidField("scale_inv", "FLOAT32 of rank 2",
                        absl::StrCat(DTypeName(scale_inv.dtype()), " ",
                                     ShapeToString(scale_inv.shape())));
  }
  ASSIGN_OR_RETURN(const ScopedDevice device, EnterDevice(scale_inv.device().index));
  const bool transpose = !two_d;  // 1D scales [M, K/128] become [K/128, roundup(M, 4)]
  const int64_t rows = scale_inv.dim(0);
  const int64_t cols = scale_inv.dim(1);
  const int64_t out_rows = transpose ? cols : rows;
  const int64_t ld = RoundUp(transpose ? rows : cols, kBlockScalesGemmAlignment);
  // Stream-ordered and unfilled: the kernel writes every entry, the padding's zeros too.
  ASSIGN_OR_RETURN(Tensor out, Tensor::Empty(DType::kFloat32, {out_rows, ld}, scale_inv.device(), ctx.stream));
  TESERVE_CUDA_RETURN_IF_ERROR(LaunchBlockScalesGemmLayout(
      scale_inv.data<float>(), rows, cols, transpose, out.data<float>(), StreamOf(ctx)));
  return out;
}

}  // namespace cuda
}  // namespace kernels
}  // namespace teserve
