// Host side of the CUDA cast family: validates metadata, allocates outputs on the
// source's device (unfilled: the kernels write every element), launches cast_kernels.cu
// on ctx.stream and turns CUDA errors into Status. Host values (amax) are copied back and the stream synchronized before return;
// device outputs are left for later work on the same stream.
#include "kernels/cuda/cast/cast_cuda.h"

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "kernels/cuda/cast/cast_kernels.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_entry.h"
#include "kernels/cuda/cuda_tensor_checks.h"
#include "kernels/cuda/scoped_device.h"
#include "kernels/scaling_math.h"

namespace teserve {
namespace kernels {
namespace cuda {
namespace {

// FP32 or BF16 source of any rank (CheckSource in cuda_tensor_checks.h also asks rank 2).
absl::StatusOr<SourceType> SourceTypeOf(const Tensor& x) {
  switch (x.dtype()) {
    case DType::kFloat32: return SourceType::kFloat32;
    case DType::kBFloat16: return SourceType::kBFloat16;
    default: return InvalidField("x.dtype", "FLOAT32 or BFLOAT16", DTypeName(x.dtype()));
  }
}


}  // namespace

absl::StatusOr<float> Amax(const Context& ctx, const Tensor& x) {
  RETURN_IF_ERROR(CheckOnCudaDevice("x", x));
  ASSIGN_OR_RETURN(const SourceType type, SourceTypeOf(x));
  ASSIGN_OR_RETURN(const ScopedDevice device, EnterDevice(x.device().index));
  ASSIGN_OR_RETURN(Tensor amax_bits, Tensor::Empty(DType::kInt32, {1}, x.device(), ctx.stream));
  const cudaStream_t stream = StreamOf(ctx);
  TESERVE_CUDA_RETURN_IF_ERROR(LaunchAmax(x.raw_data(), type, x.numel(),
                                          amax_bits.data<uint32_t>(), stream));
  return ReadAmaxBits(amax_bits.data<uint32_t>(), stream);
}

absl::StatusOr<QuantizedTensor> QuantizePerTensor(const Context& ctx, const Tensor& x,
                                                  const PerTensorQuantizeOptions& options) {
  RETURN_IF_ERROR(CheckOnCudaDevice("x", x));
  ASSIGN_OR_RETURN(const SourceType type, SourceTypeOf(x));
  if (x.rank() != 2) {
    return InvalidField("x.shape", "rank 2", ShapeToString(x.shape()));
  }
  ASSIGN_OR_RETURN(const Fp8Format format, Fp8FormatOf("options.format", options.format));
  if (options.dbias != nullptr) {
    RETURN_IF_ERROR(CheckOnCudaDevice("options.dbias", *options.dbias));
    const Tensor& d = *options.dbias;
    if (d.dtype() != DType::kFloat32 || d.shape() != Shape{x.dim(1)}) {
      return InvalidField("options.dbias", absl::StrCat("FLOAT32 [", x.dim(1), "]"),
                          absl::StrCat(DTypeName(d.dtype()), " ", ShapeToString(d.shape())));
    }
    if (d.device() != x.device()) {
      return InvalidField("options.dbias.device", x.device().ToString(), d.device().ToString());
    }
  }
  ASSIGN_OR_RETURN(const ScopedDevice device, EnterDevice(x.device().index));

  QuantizedTensor q;
  QuantizeLaunchParams params;
  params.x = x.raw_data();
  params.type = type;
  params.rows = x.dim(0);
  params.cols = x.dim(1);
  params.format = format;
  Tensor amax_bits;
  RETURN_IF_ERROR(
      AllocatePerTensorFp8(params.rows, params.cols, options, x.device(), ctx.stream, &q, &amax_bits, &params));
  Tensor dbias_workspace;  // freed in stream order (after the kernels that use it)
  if (options.dbias != nullptr) {
    params.dbias = options.dbias->data<float>();
    ASSIGN_OR_RETURN(dbias_workspace,
                     Tensor::ZerosOn(DType::kFloat32, {QuantizeDbiasWorkspaceFloats(params)}, x.device(), ctx.stream));
    params.dbias_workspace = dbias_workspace.data<float>();
  }
  const cudaStream_t stream = StreamOf(ctx);
  Tensor scale_pair;  // current scaling: {scale, scale_inv}, freed in stream order
  if (options.current.has_value()) {
    const float fp8_max = DTypeMaxFinite(options.format);
    const CurrentScaleRule& rule = *options.current;
    if (x.numel() == 0) {  // the amax of nothing is 0: known without the device
      params.scale = scaling_math::CurrentScale(0.0f, fp8_max, rule.amax_epsilon, rule.power_2_scale);
      params.scale_inv = 1.0f / params.scale;
    } else {
      // An amax pass, then the scale on the device: the cast reads it from there.
      ASSIGN_OR_RETURN(Tensor x_amax, Tensor::Empty(DType::kInt32, {1}, x.device(), ctx.stream));
      ASSIGN_OR_RETURN(scale_pair, Tensor::Empty(DType::kFloat32, {2}, x.device(), ctx.stream));
      TESERVE_CUDA_RETURN_IF_ERROR(LaunchAmax(x.raw_data(), type, x.numel(), x_amax.data<uint32_t>(), stream));
      TESERVE_CUDA_RETURN_IF_ERROR(LaunchCurrentScale(x_amax.data<uint32_t>(), fp8_max, rule.amax_epsilon,
                                                      rule.power_2_scale, scale_pair.data<float>(), stream));
      params.scale_pair = scale_pair.data<float>();
    }
  }
  TESERVE_CUDA_RETURN_IF_ERROR(LaunchQuantizePerTensor(params, stream));
  if (options.defer_amax) {
    q.amax_bits = std::move(amax_bits);  // freed on the stream, after whoever reads it
    return q;
  }
  ASSIGN_OR_RETURN(q.amax, ReadAmaxBits(params.amax_bits, stream));
  return q;
}

absl::StatusOr<Tensor> Dequantize(const Context& ctx, const QuantizedTensor& q, Copy copy) {
  const bool rowwise = copy == Copy::kRowwise;
  const char* data_name = rowwise ? "q.rowwise_data" : "q.columnwise_data";
  const Tensor& data = rowwise ? q.rowwise_data : q.columnwise_data;
  const Tensor& scale_inv = rowwise ? q.rowwise_scale_inv : q.columnwise_scale_inv;
  RETURN_IF_ERROR(CheckOnCudaDevice(data_name, data));
  RETURN_IF_ERROR(CheckOnCudaDevice(rowwise ? "q.rowwise_scale_inv" : "q.columnwise_scale_inv",
                              scale_inv));
  ASSIGN_OR_RETURN(const Fp8Format format,
                   Fp8FormatOf(absl::StrCat(data_name, ".dtype"), data.dtype()));
  if (scale_inv.dtype() != DType::kFloat32 || scale_inv.numel() != 1) {
    return InvalidField("scale_inv", "FLOAT32 [1]",
                        absl::StrCat(DTypeName(scale_inv.dtype()), " ",
                                     ShapeToString(scale_inv.shape())));
  }
  ASSIGN_OR_RETURN(const ScopedDevice device, EnterDevice(data.device().index));
  ASSIGN_OR_RETURN(Tensor out, Tensor::Empty(DType::kFloat32, data.shape(), data.device(), ctx.stream));
  TESERVE_CUDA_RETURN_IF_ERROR(LaunchDequantize(data.data<uint8_t>(), format, data.numel(),
                                                scale_inv.data<float>(), out.data<float>(),
                                                StreamOf(ctx)));
  return out;
}

absl::StatusOr<ConvertType> ConvertTypeOf(absl::string_view field, DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return ConvertType::kFloat32;
    case DType::kFloat16: return ConvertType::kFloat16;
    case DType::kBFloat16: return ConvertType::kBFloat16;
    case DType::kFloat8E4M3: return ConvertType::kE4M3;
    case DType::kFloat8E5M2: return ConvertType::kE5M2;
    default:
      return InvalidField(field, "FLOAT32, FLOAT16, BFLOAT16, FLOAT8_E4M3 or FLOAT8_E5M2", DTypeName(dtype));
  }
}

absl::StatusOr<Tensor> ToFloat32(const Context& ctx, const Tensor& x) {
  RETURN_IF_ERROR(CheckOnCudaDevice("x", x));
  ASSIGN_OR_RETURN(const ConvertType type, ConvertTypeOf("x.dtype", x.dtype()));
  ASSIGN_OR_RETURN(const ScopedDevice device, EnterDevice(x.device().index));
  ASSIGN_OR_RETURN(Tensor out, Tensor::Empty(DType::kFloat32, x.shape(), x.device(), ctx.stream));
  TESERVE_CUDA_RETURN_IF_ERROR(
      LaunchToFloat32(x.raw_data(), type, x.numel(), out.data<float>(), StreamOf(ctx)));
  return out;
}

absl::StatusOr<Tensor> CastFromFloat32(const Context& ctx, const Tensor& x, DType dtype) {
  RETURN_IF_ERROR(CheckOnCudaDevice("x", x));
  if (x.dtype() != DType::kFloat32) return InvalidField("x.dtype", "FLOAT32", DTypeName(x.dtype()));
  ASSIGN_OR_RETURN(const ConvertType type, ConvertTypeOf("dtype", dtype));
  ASSIGN_OR_RETURN(const ScopedDevice device, EnterDevice(x.device().index));
  ASSIGN_OR_RETURN(Tensor out, Tensor::Empty(dtype, x.shape(), x.device(), ctx.stream));
  TESERVE_CUDA_RETURN_IF_ERROR(
      LaunchFromFloat32(x.data<float>(), x.numel(), type, out.raw_data(), StreamOf(ctx)));
  return out;
}

absl::StatusOr<Tensor> CopyToDevice(const Context& ctx, const Tensor& host, Device device) {
  if (!host.defined() || !host.device().is_cpu()) {
    return InvalidField("host", "a CPU tensor",
                        host.defined() ? host.device().ToString() : "an undefined tensor");
  }
  if (device.type != DeviceType::kCuda) {
    return InvalidField("device", "a CUDA device", device.ToString());
  }
  ASSIGN_OR_RETURN(const ScopedDevice scoped, EnterDevice(device.index));
  ASSIGN_OR_RETURN(Tensor out, Tensor::Empty(host.dtype(), host.shape(), device, ctx.stream));
  if (host.nbytes() > 0) {
    const cudaStream_t stream = StreamOf(ctx);
    TESERVE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(out.raw_data(), host.raw_data(), host.nbytes(),
                                                 cudaMemcpyHostToDevice, stream));
    TESERVE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  }
  return out;
}

absl::StatusOr<Tensor> CopyToHost(const Context& ctx, const Tensor& device_tensor) {
  RETURN_IF_ERROR(CheckOnCudaDevice("device_tensor", device_tensor));
  ASSIGN_OR_RETURN(const ScopedDevice scoped, EnterDevice(device_tensor.device().index));
  ASSIGN_OR_RETURN(Tensor out, Tensor::Zeros(device_tensor.dtype(), device_tensor.shape()));
  if (device_tensor.nbytes() > 0) {
    const cudaStream_t stream = StreamOf(ctx);
    TESERVE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(out.raw_data(), device_tensor.raw_data(),
                                                 device_tensor.nbytes(), cudaMemcpyDeviceToHost,
                                                 stream));
    TESERVE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  }
  return out;
}

}  // namespace cuda
}  // namespace kernels
}  // namespace teserve
