// Host side of the CUDA NVFP4 ops: checks what the launchers rely on, runs the amax
// pass, derives the global encode scale on the host with the same function the CPU
// uses (Nvfp4GlobalEncodeScale), launches the quantize pass and turns CUDA errors into
// Status.
#include "kernels/cuda/nvfp4/nvfp4_cuda.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "kernels/cuda/cast/cast_cuda.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_entry.h"
#include "kernels/cuda/cuda_tensor_checks.h"
#include "kernels/cuda/nvfp4/nvfp4_kernels.h"
#include "kernels/cuda/scoped_device.h"
#include "kernels/hadamard.h"
#include "kernels/stochastic_rounding.h"

namespace teserve {
namespace kernels {
namespace cuda {
namespace {

constexpr int64_t kBlock = kNvfp4BlockSize;

HadamardSigns Signs() {
  HadamardSigns s;
  for (int j = 0; j < kHadamardPoints; ++j) s.d[j] = kHadamardSigns[j];
  return s;
}

float FloatOfBits(uint32_t bits) {
  if (bits > 0x7F800000u) bits = 0x7FC00000u;  // the CPU's canonical NaN
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

absl::Status CheckBlocked(absl::string_view name, int64_t extent) {
  if (extent % kBlock == 0) return absl::OkStatus();
  return InvalidField(name, "a multiple of 16 (NVFP4 blocks run along it)", extent);
}

absl::Status CheckOptions(const Tensor& x, const Nvfp4QuantizeOptions& options) {
  if (!options.rowwise && !options.columnwise) {
    return InvalidField("options", "rowwise and/or columnwise", "neither");
  }
  if (options.two_d && options.random_hadamard) {
    return InvalidField("options.random_hadamard", "false with two_d", "true");
  }
  if (options.rowwise || options.two_d) RETURN_IF_ERROR(CheckBlocked("x.shape[1]", x.dim(1)));
  if (options.columnwise || options.two_d) RETURN_IF_ERROR(CheckBlocked("x.shape[0]", x.dim(0)));
  return absl::OkStatus();
}

// Data [rows, cols] packed FP4 and E4M3 scales, on `device`, zero-filled on `stream`.
absl::Status AllocateCopy(int64_t rows, int64_t cols, const Shape& scale_shape, Device device, void* stream,
                          Tensor* data, Tensor* scales) {
  ASSIGN_OR_RETURN(*data, Tensor::ZerosOn(DType::kFloat4E2M1, {rows, cols}, device, stream));
  ASSIGN_OR_RETURN(*scales, Tensor::ZerosOn(DType::kFloat8E4M3, scale_shape, device, stream));
  return absl::OkStatus();
}

absl::Status CheckFp32OnCuda(absl::string_view name, const Tensor& t) {
  RETURN_IF_ERROR(CheckOnCudaDevice(name, t));
  if (t.dtype() != DType::kFloat32) {
    return InvalidField(absl::StrCat(name, ".dtype"), "FLOAT32", DTypeName(t.dtype()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<QuantizedTensor> QuantizeNvfp4(const Context& ctx, const Tensor& x,
                                              const Nvfp4QuantizeOptions& options) {
  ASSIGN_OR_RETURN(const SourceType type, CheckSource(x));
  RETURN_IF_ERROR(CheckOptions(x, options));
  ASSIGN_OR_RETURN(const ScopedDevice device, EnterDevice(x.device().index));
  const cudaStream_t stream = StreamOf(ctx);
  const int64_t rows = x.dim(0);
  const int64_t cols = x.dim(1);
  const bool rht = options.random_hadamard && options.columnwise && !options.two_d;
  const HadamardSigns signs = Signs();

  // Pass 1: amax of x, and of RHT(x^T) when the columnwise copy is transformed.
  ASSIGN_OR_RETURN(Tensor amax_bits, Tensor::ZerosOn(DType::kInt32, {2}, x.device(), ctx.stream));
  uint32_t* bits = amax_bits.data<uint32_t>();
  TESERVE_CUDA_RETURN_IF_ERROR(LaunchNvfp4Amax(x.raw_data(), type, rows, cols, signs, bits,
                                               rht ? bits + 1 : nullptr, stream));
  uint32_t host_bits[2] = {0u, 0u};
  TESERVE_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(host_bits, bits, sizeof(host_bits), cudaMemcpyDeviceToHost, stream));
  TESERVE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));

  QuantizedTensor q;
  q.shape = {rows, cols};
  q.format = DType::kFloat4E2M1;
  q.mode = options.two_d ? ScalingMode::kNvfp4_2D : ScalingMode::kNvfp4_1D;
  q.amax = FloatOfBits(host_bits[0]);
  // NaN bits exceed every other magnitude, so the max of the bits is the NaN-propagating
  // max of the two amaxes.
  const float scaling_amax =
      FloatOfBits(rht ? std::max(host_bits[0], host_bits[1]) : host_bits[0]);
  q.global_encode_scale = Nvfp4GlobalEncodeScale(scaling_amax);

  Nvfp4QuantizeLaunchParams p;
  p.x = x.raw_data();
  p.type = type;
  p.rows = rows;
  p.cols = cols;
  p.two_d = options.two_d;
  p.random_hadamard = rht;
  p.signs = signs;
  p.global_scale = q.global_encode_scale;
  p.global_scale_inv = 1.0f / q.global_encode_scale;
  p.stochastic_rounding = options.stochastic_rounding;
  p.rowwise_key = RandomKey(ctx.seed, options.rng_stream, kRowwiseCopyId);
  p.columnwise_key = RandomKey(ctx.seed, options.rng_stream, kColumnwiseCopyId);
  if (options.rowwise) {
    const Shape scale_shape = options.two_d ? Shape{rows / kBlock, cols / kBlock}
                                            : Shape{rows, cols / kBlock};
    RETURN_IF_ERROR(AllocateCopy(rows, cols, scale_shape, x.device(), ctx.stream, &q.rowwise_data,
                                 &q.rowwise_scale_inv));
    p.rowwise = q.rowwise_data.data<uint8_t>();
    p.rowwise_scales = q.rowwise_scale_inv.data<uint8_t>();
  }
  if (options.columnwise) {
    const Shape scale_shape = options.two_d ? Shape{cols / kBlock, rows / kBlock}
                                            : Shape{cols, rows / kBlock};
    RETURN_IF_ERROR(AllocateCopy(cols, rows, scale_shape, x.device(), ctx.stream, &q.columnwise_data,
                                 &q.columnwise_scale_inv));
    p.columnwise = q.columnwise_data.data<uint8_t>();
    p.columnwise_scales = q.columnwise_scale_inv.data<uint8_t>();
  }
  TESERVE_CUDA_RETURN_IF_ERROR(LaunchNvfp4Quantize(p, stream));
  return q;
}

absl::StatusOr<Tensor> DequantizeNvfp4(const Context& ctx, const QuantizedTensor& q, Copy copy, DType out_dtype) {
  const bool rowwise = copy == Copy::kRowwise;
  const Tensor& data = rowwise ? q.rowwise_data : q.columnwise_data;
  const Tensor& scales = rowwise ? q.rowwise_scale_inv : q.columnwise_scale_inv;
  RETURN_IF_ERROR(CheckOnCudaDevice(rowwise ? "q.rowwise_data" : "q.columnwise_data", data));
  RETURN_IF_ERROR(
      CheckOnCudaDevice(rowwise ? "q.rowwise_scale_inv" : "q.columnwise_scale_inv", scales));
  if (data.dtype() != DType::kFloat4E2M1 || data.rank() != 2 || data.dim(1) % kBlock != 0) {
    return InvalidField("q data", "FLOAT4_E2M1 [R, C] with C % 16 == 0",
                        absl::StrCat(DTypeName(data.dtype()), " ", ShapeToString(data.shape())));
  }
  ASSIGN_OR_RETURN(const ScopedDevice device, EnterDevice(data.device().index));
  // Every element is written.
  ASSIGN_OR_RETURN(Tensor out, Tensor::Empty(out_dtype, data.shape(), data.device(), ctx.stream));
  TESERVE_CUDA_RETURN_IF_ERROR(LaunchNvfp4Dequantize(
      data.data<uint8_t>(), data.dim(0), data.dim(1), scales.data<uint8_t>(),
      q.mode == ScalingMode::kNvfp4_2D, 1.0f / q.global_encode_scale, out.raw_data(),
      out_dtype == DType::kBFloat16, StreamOf(ctx)));
  return out;
}

absl::StatusOr<Tensor> CastToFloat4E2M1(const Context& ctx, const Tensor& x) {
  RETURN_IF_ERROR(CheckFp32OnCuda("x", x));
  ASSIGN_OR_RETURN(const ScopedDevice device, EnterDevice(x.device().index));
  ASSIGN_OR_RETURN(Tensor out, Tensor::ZerosOn(DType::kFloat4E2M1, x.shape(), x.device(), ctx.stream));
  TESERVE_CUDA_RETURN_IF_ERROR(
      LaunchCastToE2M1(x.data<float>(), x.numel(), out.data<uint8_t>(), StreamOf(ctx)));
  return out;
}

absl::StatusOr<Tensor> Float4E2M1ToFloat32(const Context& ctx, const Tensor& packed) {
  RETURN_IF_ERROR(CheckOnCudaDevice("packed", packed));
  if (packed.dtype() != DType::kFloat4E2M1) {
    return InvalidField("packed.dtype", "FLOAT4_E2M1", DTypeName(packed.dtype()));
  }
  ASSIGN_OR_RETURN(const ScopedDevice device, EnterDevice(packed.device().index));
  ASSIGN_OR_RETURN(Tensor out, Tensor::ZerosOn(DType::kFloat32, packed.shape(), packed.device(), ctx.stream));
  TESERVE_CUDA_RETURN_IF_ERROR(
      LaunchE2M1ToFloat(packed.data<uint8_t>(), packed.numel(), out.data<float>(), StreamOf(ctx)));
  return out;
}

absl::StatusOr<Tensor> ApplyHadamard16(const Context& ctx, const Tensor& x, bool inverse) {
  RETURN_IF_ERROR(CheckFp32OnCuda("x", x));
  if (x.rank() != 2 || x.dim(1) % kHadamardSize != 0) {
    return InvalidField("x.shape", "[rows, cols] with cols % 16 == 0", ShapeToString(x.shape()));
  }
  ASSIGN_OR_RETURN(const ScopedDevice device, EnterDevice(x.device().index));
  ASSIGN_OR_RETURN(Tensor out, Tensor::ZerosOn(DType::kFloat32, x.shape(), x.device(), ctx.stream));
  TESERVE_CUDA_RETURN_IF_ERROR(LaunchHadamard16(x.data<float>(), x.numel(), Signs(), inverse,
                                                out.data<float>(), StreamOf(ctx)));
  return out;
}

}  // namespace cuda
}  // namespace kernels
}  // namespace teserve
