// Checked entry points of kernels/nvfp4.h. Each validates tensor metadata and options
// (errors name the argument and say expected vs got), then dispatches on the Context's
// device: kernels/cpu for the CPU, kernels/cuda when the CUDA backend is compiled in
// (TESERVE_WITH_CUDA); without it CUDA tensors get UNIMPLEMENTED (kernels/dispatch.h).
#include "kernels/nvfp4.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "kernels/cpu/cast_cpu.h"
#include "kernels/cpu/nvfp4_cpu.h"
#include "kernels/dispatch.h"
#include "kernels/tensor_checks.h"
#include "kernels/timing.h"

#if TESERVE_WITH_CUDA
#include "kernels/cuda/nvfp4/nvfp4_cuda.h"
#endif

namespace teserve {
namespace kernels {
namespace {

absl::Status CheckBlockedDim(absl::string_view name, int64_t extent) {
  if (extent % kNvfp4BlockSize == 0) return absl::OkStatus();
  return InvalidField(name, "a multiple of 16 (NVFP4 blocks run along it)", extent);
}

absl::Status CheckQuantizeArgs(const Tensor& x, const Nvfp4QuantizeOptions& options,
                               const Context& ctx) {
  RETURN_IF_ERROR(CheckTensor("x", x, DType::kFloat32, 2, ctx));
  RETURN_IF_ERROR(CheckCopiesRequested("options", options.rowwise, options.columnwise));
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
  RETURN_IF_ERROR(CheckFinitePositive("q.global_encode_scale", q.global_encode_scale));
  const bool rowwise = copy == Copy::kRowwise;
  const bool two_d = q.mode == ScalingMode::kNvfp4_2D;
  const QuantizedCopy c = SelectCopy(q, copy);
  RETURN_IF_ERROR(CheckBlockedDim(rowwise ? "q.shape[1]" : "q.shape[0]", c.cols));
  if (two_d) RETURN_IF_ERROR(CheckBlockedDim(rowwise ? "q.shape[0]" : "q.shape[1]", c.rows));
  RETURN_IF_ERROR(CheckTensor(c.data_name, c.data, DType::kFloat4E2M1, 2, ctx));
  RETURN_IF_ERROR(CheckShape(c.data_name, c.data, {c.rows, c.cols}));
  RETURN_IF_ERROR(CheckTensor(c.scale_name, c.scale_inv, DType::kFloat8E4M3, 2, ctx));
  return CheckShape(c.scale_name, c.scale_inv,
                    {two_d ? c.rows / kNvfp4BlockSize : c.rows, c.cols / kNvfp4BlockSize});
}

}  // namespace

absl::StatusOr<QuantizedTensor> QuantizeNvfp4(const Context& ctx, const Tensor& x,
                                              const Nvfp4QuantizeOptions& options) {
  RETURN_IF_ERROR(CheckQuantizeArgs(x, options, ctx));
  ScopedKernelTimer timer(ctx, KernelOp::kQuantizeNvfp4);
  return Dispatch("QuantizeNvfp4", ctx, [&] { return cpu::QuantizeNvfp4(ctx, x, options); },
                  TESERVE_CUDA_KERNEL([&] { return cuda::QuantizeNvfp4(ctx, x, options); }));
}

absl::StatusOr<Tensor> DequantizeNvfp4(const Context& ctx, const QuantizedTensor& q, Copy copy, DType out_dtype) {
  RETURN_IF_ERROR(CheckQuantizedCopy(q, copy, ctx));
  RETURN_IF_ERROR(CheckDequantizeOutput(out_dtype));
  ScopedKernelTimer timer(ctx, KernelOp::kDequantizeNvfp4);
  return Dispatch(
      "DequantizeNvfp4", ctx,
      [&]() -> absl::StatusOr<Tensor> {
        ASSIGN_OR_RETURN(Tensor out, cpu::DequantizeNvfp4(ctx, q, copy));
        if (out_dtype == DType::kFloat32) return out;
        return cpu::CastFromFloat32(ctx, out, out_dtype);
      },
      TESERVE_CUDA_KERNEL([&] { return cuda::DequantizeNvfp4(ctx, q, copy, out_dtype); }));
}

absl::StatusOr<Tensor> CastToFloat4E2M1(const Context& ctx, const Tensor& x) {
  RETURN_IF_ERROR(CheckTensor("x", x, DType::kFloat32, kAnyRank, ctx));
  return Dispatch("CastToFloat4E2M1", ctx, [&] { return cpu::CastToFloat4E2M1(ctx, x); },
                  TESERVE_CUDA_KERNEL([&] { return cuda::CastToFloat4E2M1(ctx, x); }));
}

absl::StatusOr<Tensor> Float4E2M1ToFloat32(const Context& ctx, const Tensor& packed) {
  RETURN_IF_ERROR(CheckTensor("packed", packed, DType::kFloat4E2M1, kAnyRank, ctx));
  return Dispatch("Float4E2M1ToFloat32", ctx, [&] { return cpu::Float4E2M1ToFloat32(ctx, packed); },
                  TESERVE_CUDA_KERNEL([&] { return cuda::Float4E2M1ToFloat32(ctx, packed); }));
}

}  // namespace kernels
}  // namespace teserve
