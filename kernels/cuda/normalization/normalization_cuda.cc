// Host side of the CUDA normalization family: checks devices and sm_margin, allocates
// outputs (and the backward's workspace) on x's device, fills the launch parameters of
// normalization_kernels.h and turns CUDA errors into Status.
#include "kernels/cuda/normalization/normalization_cuda.h"

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "kernels/block_quantize.h"
#include "kernels/cuda/cast/cast_cuda.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_entry.h"
#include "kernels/cuda/cuda_tensor_checks.h"
#include "kernels/cuda/normalization/normalization_kernels.h"
#include "kernels/cuda/scoped_device.h"

namespace teserve {
namespace kernels {
namespace cuda {
namespace {

// Defined tensors must sit on `device` (a CUDA device); undefined ones are skipped.
absl::Status CheckOn(absl::string_view name, const Tensor& t, Device device) {
  if (!t.defined() || t.device() == device) return absl::OkStatus();
  return InvalidField(absl::StrCat(name, ".device"), device.ToString(), t.device().ToString());
}

absl::StatusOr<NormDType> NormDTypeOf(absl::string_view field, DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return NormDType::kFloat32;
    case DType::kFloat16: return NormDType::kFloat16;
    case DType::kBFloat16: return NormDType::kBFloat16;
    default: return InvalidField(field, "one of FLOAT32, FLOAT16, BFLOAT16", DTypeName(dtype));
  }
}

// sm_margin must leave at least one SM of the current device.
absl::Status CheckSmMargin(int sm_margin) {
  int device = 0;
  int sms = 0;
  TESERVE_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  TESERVE_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  if (sm_margin >= 0 && sm_margin < sms) return absl::OkStatus();
  return InvalidField("options.sm_margin", absl::StrCat("0..", sms - 1, " (the device has ", sms, " SMs)"),
                      sm_margin);
}

}  // namespace

absl::StatusOr<NormForwardResult> NormalizationForward(const Context& ctx, NormType type,
                                                       const Tensor& x, const Tensor& gamma,
                                                       const Tensor& beta,
                                                       const NormForwardOptions& options) {
  const Device device = x.device();
  if (device.type != DeviceType::kCuda) {
    return InvalidField("x.device", "a CUDA device", device.ToString());
  }
  RETURN_IF_ERROR(CheckOn("gamma", gamma, device));
  RETURN_IF_ERROR(CheckOn("beta", beta, device));
  ASSIGN_OR_RETURN(const NormDType x_type, NormDTypeOf("x.dtype", x.dtype()));
  const DType y_dtype = options.y_dtype.value_or(x.dtype());
  ASSIGN_OR_RETURN(const NormDType y_type, NormDTypeOf("options.y_dtype", y_dtype));
  ASSIGN_OR_RETURN(const ScopedDevice scoped, EnterDevice(device.index));
  RETURN_IF_ERROR(CheckSmMargin(options.sm_margin));

  const int64_t n = x.dim(0);
  const int64_t h = x.dim(1);
  const bool layer_norm = type == NormType::kLayerNorm;
  NormForwardResult out;
  NormForwardParams p;
  p.rms = !layer_norm;
  p.x = x.raw_data();
  p.x_type = x_type;
  p.rows = n;
  p.cols = h;
  p.gamma = gamma.data<float>();
  p.beta = layer_norm ? beta.data<float>() : nullptr;
  p.eps = options.eps;
  p.zero_centered_gamma = options.zero_centered_gamma;
  p.sm_margin = options.sm_margin;
  ASSIGN_OR_RETURN(out.rsigma, Tensor::Empty(DType::kFloat32, {n}, device, ctx.stream));
  p.rsigma = out.rsigma.data<float>();
  if (layer_norm) {
    ASSIGN_OR_RETURN(out.mu, Tensor::Empty(DType::kFloat32, {n}, device, ctx.stream));
    p.mu = out.mu.data<float>();
  }
  if (options.write_y) {
    ASSIGN_OR_RETURN(out.y, Tensor::Empty(y_dtype, {n, h}, device, ctx.stream));
    p.y = out.y.raw_data();
    p.y_type = y_type;
  }
  Tensor amax_bits;
  if (options.mxfp8) {
    // One fused kernel (the register tile); FusesMxfp8 says for which inputs.
    const Mxfp8QuantizeOptions& q = options.mxfp8_options;
    QuantizedTensor& fp8 = out.fp8;
    fp8.shape = {n, h};
    fp8.format = q.format;
    fp8.mode = ScalingMode::kMxfp8_1D;
    p.mxfp8 = true;
    p.format = q.format == DType::kFloat8E4M3 ? Fp8Format::kE4M3 : Fp8Format::kE5M2;
    if (q.rowwise) {
      ASSIGN_OR_RETURN(fp8.rowwise_data, Tensor::Empty(q.format, {n, h}, device, ctx.stream));
      ASSIGN_OR_RETURN(fp8.rowwise_scale_inv,
                       Tensor::ZerosOn(DType::kFloat8E8M0, {n, h / kMxfp8BlockSize}, device, ctx.stream));
      p.rowwise = fp8.rowwise_data.data<uint8_t>();
      p.rowwise_e8m0 = fp8.rowwise_scale_inv.data<uint8_t>();
    }
    if (q.columnwise) {
      ASSIGN_OR_RETURN(fp8.columnwise_data, Tensor::Empty(q.format, {h, n}, device, ctx.stream));
      ASSIGN_OR_RETURN(fp8.columnwise_scale_inv,
                       Tensor::ZerosOn(DType::kFloat8E8M0, {h, n / kMxfp8BlockSize}, device, ctx.stream));
      p.columnwise = fp8.columnwise_data.data<uint8_t>();
      p.columnwise_e8m0 = fp8.columnwise_scale_inv.data<uint8_t>();
    }
    ASSIGN_OR_RETURN(amax_bits, Tensor::Empty(DType::kInt32, {1}, device, ctx.stream));
    p.amax_bits = amax_bits.data<uint32_t>();
  }
  if (options.quantize) {
    const PerTensorQuantizeOptions& q = options.quantize_options;
    p.format = q.format == DType::kFloat8E4M3 ? Fp8Format::kE4M3 : Fp8Format::kE5M2;
    RETURN_IF_ERROR(AllocatePerTensorFp8(n, h, q, device, ctx.stream, &out.fp8, &amax_bits, &p));
  }
  const cudaStream_t stream = StreamOf(ctx);
  TESERVE_CUDA_RETURN_IF_ERROR(LaunchNormForward(p, stream));
  if (options.quantize || options.mxfp8) {
    const bool defer = options.quantize ? options.quantize_options.defer_amax : options.mxfp8_options.defer_amax;
    if (defer) {
      out.fp8.amax_bits = std::move(amax_bits);  // freed on the stream, after whoever reads it
    } else {
      ASSIGN_OR_RETURN(out.fp8.amax, ReadAmaxBits(p.amax_bits, stream));
    }
  }
  return out;
}

absl::StatusOr<bool> FusesMxfp8(NormType type, const Tensor& x, const Tensor& gamma,
                                const Tensor& beta, const NormForwardOptions& options) {
  if (!options.mxfp8 || x.device().type != DeviceType::kCuda) return false;
  if (x.dtype() != DType::kBFloat16 && x.dtype() != DType::kFloat16) return false;
  const DType y_dtype = options.y_dtype.value_or(x.dtype());
  if (!IsHighPrecisionFloat(y_dtype)) return false;
  const Mxfp8QuantizeOptions& q = options.mxfp8_options;
  if (q.dbias != nullptr || (!q.rowwise && !q.columnwise)) return false;
  if (q.format != DType::kFloat8E4M3 && q.format != DType::kFloat8E5M2) return false;
  ASSIGN_OR_RETURN(const ScopedDevice scoped, EnterDevice(x.device().index));
  RETURN_IF_ERROR(CheckSmMargin(options.sm_margin));
  const bool layer_norm = type == NormType::kLayerNorm;
  NormForwardParams p;
  p.rms = !layer_norm;
  p.x = x.raw_data();
  p.x_type = x.dtype() == DType::kBFloat16 ? NormDType::kBFloat16 : NormDType::kFloat16;
  p.rows = x.dim(0);
  p.cols = x.dim(1);
  p.gamma = gamma.data<float>();
  p.beta = layer_norm ? beta.data<float>() : nullptr;
  p.sm_margin = options.sm_margin;
  p.mxfp8 = true;
  p.format = q.format == DType::kFloat8E4M3 ? Fp8Format::kE4M3 : Fp8Format::kE5M2;
  // Planning reads only the outputs' alignment. NormalizationForward allocates them fresh
  // (256-byte aligned), so x's address (which the kernel needs 16-byte aligned) stands in.
  uint8_t* stand_in = static_cast<uint8_t*>(const_cast<void*>(x.raw_data()));
  if (options.write_y) {
    p.y = stand_in;
    p.y_type = y_dtype == DType::kFloat32   ? NormDType::kFloat32
               : y_dtype == DType::kFloat16 ? NormDType::kFloat16
                                            : NormDType::kBFloat16;
  }
  if (q.rowwise) p.rowwise = p.rowwise_e8m0 = stand_in;
  if (q.columnwise) p.columnwise = p.columnwise_e8m0 = stand_in;
  NormForwardPlan plan;
  const cudaError_t status = PlanNormForward(p, &plan);
  if (status == cudaErrorNotSupported) return false;
  TESERVE_CUDA_RETURN_IF_ERROR(status);
  return plan.register_tile;
}

absl::StatusOr<NormBackwardOutputs> NormalizationBackward(const Context& ctx, NormType type,
                                                          const Tensor& dy, const Tensor& x,
                                                          const Tensor& mu, const Tensor& rsigma,
                                                          const Tensor& gamma,
                                                          const NormBackwardOptions& options) {
  const Device device = x.device();
  if (device.type != DeviceType::kCuda) {
    return InvalidField("x.device", "a CUDA device", device.ToString());
  }
  RETURN_IF_ERROR(CheckOn("dy", dy, device));
  RETURN_IF_ERROR(CheckOn("mu", mu, device));
  RETURN_IF_ERROR(CheckOn("rsigma", rsigma, device));
  RETURN_IF_ERROR(CheckOn("gamma", gamma, device));
  ASSIGN_OR_RETURN(const NormDType dtype, NormDTypeOf("x.dtype", x.dtype()));
  ASSIGN_OR_RETURN(const ScopedDevice scoped, EnterDevice(device.index));
  RETURN_IF_ERROR(CheckSmMargin(options.sm_margin));

  const int64_t n = x.dim(0);
  const int64_t h = x.dim(1);
  const bool layer_norm = type == NormType::kLayerNorm;
  NormBackwardOutputs out;
  NormBackwardParams p;
  p.rms = !layer_norm;
  p.dy = dy.raw_data();
  p.x = x.raw_data();
  p.type = dtype;
  p.rows = n;
  p.cols = h;
  p.mu = layer_norm ? mu.data<float>() : nullptr;
  p.rsigma = rsigma.data<float>();
  p.gamma = gamma.data<float>();
  p.zero_centered_gamma = options.zero_centered_gamma;
  p.sm_margin = options.sm_margin;
  ASSIGN_OR_RETURN(out.dx, Tensor::Empty(x.dtype(), {n, h}, device, ctx.stream));
  p.dx = out.dx.raw_data();
  ASSIGN_OR_RETURN(out.dgamma, Tensor::ZerosOn(DType::kFloat32, {h}, device, ctx.stream));
  p.dgamma = out.dgamma.data<float>();
  if (layer_norm) {
    ASSIGN_OR_RETURN(out.dbeta, Tensor::ZerosOn(DType::kFloat32, {h}, device, ctx.stream));
    p.dbeta = out.dbeta.data<float>();
  }
  int64_t workspace_floats = 0;
  TESERVE_CUDA_RETURN_IF_ERROR(NormBackwardWorkspaceFloats(p, &workspace_floats));
  ASSIGN_OR_RETURN(Tensor workspace, Tensor::ZerosOn(DType::kFloat32, {workspace_floats}, device, ctx.stream));
  p.workspace = workspace.data<float>();
  const cudaStream_t stream = StreamOf(ctx);
  TESERVE_CUDA_RETURN_IF_ERROR(LaunchNormBackward(p, stream));
  // The workspace is freed (cudaFree, which waits for the device) when it goes out of scope.
  return out;
}

}  // namespace cuda
}  // namespace kernels
}  // namespace teserve
