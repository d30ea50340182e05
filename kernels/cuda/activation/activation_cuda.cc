// Host side of the CUDA activations: checks devices and dtypes, maps the activation kind
// to the kernels' scalar function (kernels/cuda/activation/activation_kernels.h), allocates outputs
// (and the dbias workspace) on x's device and turns CUDA errors into Status.
#include "kernels/cuda/activation/activation_cuda.h"

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "kernels/activation_math.h"
#include "kernels/cuda/activation/activation_kernels.h"
#include "kernels/cuda/cast/cast_cuda.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_entry.h"
#include "kernels/cuda/cuda_tensor_checks.h"
#include "kernels/cuda/scoped_device.h"

namespace teserve {
namespace kernels {
namespace cuda {
namespace {

absl::StatusOr<ActDType> ActDTypeOf(absl::string_view field, DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return ActDType::kFloat32;
    case DType::kFloat16: return ActDType::kFloat16;
    case DType::kBFloat16: return ActDType::kBFloat16;
    default: return InvalidField(field, "one of FLOAT32, FLOAT16, BFLOAT16", DTypeName(dtype));
  }
}

// The kernels' description of `kind` (the same ops the CPU reference picks).
ActivationFunctionParams FunctionOf(Activation kind, const ActivationParams& params) {
  ActivationFunctionParams f;
  f.gated = IsGated(kind);
  switch (kind) {
    case Activation::kGelu:
    case Activation::kGeglu: f.function = ActFunction::kGelu; break;
    case Activation::kQgelu:
    case Activation::kQgeglu:
      f.function = ActFunction::kSigmoidLinear;
      f.alpha = act::kQuickGeluAlpha;
      break;
    case Activation::kRelu:
    case Activation::kReglu: f.function = ActFunction::kRelu; break;
    case Activation::kSrelu:
    case Activation::kSreglu: f.function = ActFunction::kSquaredRelu; break;
    case Activation::kSilu:
    case Activation::kSwiglu:
      f.function = ActFunction::kSigmoidLinear;
      f.alpha = 1.0f;
      break;
    case Activation::kClampedSwiglu:
      f.function = ActFunction::kSigmoidLinear;
      f.alpha = params.alpha;
      f.clamped = true;
      f.limit = params.limit;
      f.offset = 1.0f;
      break;
  }
  return f;
}

absl::Status CheckOn(absl::string_view name, const Tensor& t, Device device) {
  if (t.device() == device) return absl::OkStatus();
  return InvalidField(absl::StrCat(name, ".device"), device.ToString(), t.device().ToString());
}

}  // namespace

absl::StatusOr<ActivationForwardResult> FusedActivationForward(const Context& ctx, Activation kind,
                                                               const ActivationParams& params,
                                                               const Tensor& x,
                                                               const ActivationForwardOptions& options) {
  RETURN_IF_ERROR(CheckOnCudaDevice("x", x));
  const Device device = x.device();
  ASSIGN_OR_RETURN(const ActDType x_type, ActDTypeOf("x.dtype", x.dtype()));
  const DType y_dtype = options.y_dtype.value_or(x.dtype());
  ASSIGN_OR_RETURN(const ActDType y_type, ActDTypeOf("options.y_dtype", y_dtype));
  ASSIGN_OR_RETURN(const ScopedDevice scoped, EnterDevice(device.index));

  const int64_t rows = x.dim(0);
  const int64_t k = IsGated(kind) ? x.dim(1) / 2 : x.dim(1);
  ActivationForwardResult out;
  ActivationForwardParams p;
  p.act = FunctionOf(kind, params);
  p.x = x.raw_data();
  p.x_type = x_type;
  p.rows = rows;
  p.cols = k;
  if (options.write_y) {
    ASSIGN_OR_RETURN(out.y, Tensor::Empty(y_dtype, {rows, k}, device, ctx.stream));
    p.y = out.y.raw_data();
    p.y_type = y_type;
  }
  Tensor amax_bits;
  if (options.quantize) {
    const PerTensorQuantizeOptions& q = options.quantize_options;
    ASSIGN_OR_RETURN(p.format, Fp8FormatOf("options.quantize_options.format", q.format));
    RETURN_IF_ERROR(AllocatePerTensorFp8(rows, k, q, device, ctx.stream, &out.fp8, &amax_bits, &p));
  }
  const cudaStream_t stream = StreamOf(ctx);
  TESERVE_CUDA_RETURN_IF_ERROR(LaunchActivationForward(p, stream));
  if (options.quantize && options.quantize_options.defer_amax) {
    out.fp8.amax_bits = std::move(amax_bits);  // freed on the stream, after whoever reads it
  } else if (options.quantize) {
    ASSIGN_OR_RETURN(out.fp8.amax, ReadAmaxBits(p.amax_bits, stream));
  }
  return out;
}

absl::StatusOr<ActivationBackwardResult> FusedActivationBackward(const Context& ctx, Activation kind,
                                                                 const ActivationParams& params,
                                                                 const Tensor& dy, const Tensor& x,
                                                                 const ActivationBackwardOptions& options) {
  RETURN_IF_ERROR(CheckOnCudaDevice("x", x));
  const Device device = x.device();
  RETURN_IF_ERROR(CheckOn("dy", dy, device));
  ASSIGN_OR_RETURN(const ActDType type, ActDTypeOf("x.dtype", x.dtype()));
  ASSIGN_OR_RETURN(const ScopedDevice scoped, EnterDevice(device.index));

  const int64_t rows = x.dim(0);
  const int64_t cols = x.dim(1);
  ActivationBackwardResult out;
  ActivationBackwardParams p;
  p.act = FunctionOf(kind, params);
  p.dy = dy.raw_data();
  p.x = x.raw_data();
  p.type = type;
  p.rows = rows;
  p.cols = IsGated(kind) ? cols / 2 : cols;
  ASSIGN_OR_RETURN(out.dx, Tensor::Empty(x.dtype(), {rows, cols}, device, ctx.stream));
  p.dx = out.dx.raw_data();
  Tensor workspace;
  if (options.compute_dbias) {
    ASSIGN_OR_RETURN(out.dbias, Tensor::ZerosOn(DType::kFloat32, {cols}, device, ctx.stream));
    p.dbias = out.dbias.data<float>();
    ASSIGN_OR_RETURN(workspace,
                     Tensor::ZerosOn(DType::kFloat32, {ActivationBackwardWorkspaceFloats(p)}, device, ctx.stream));
    p.workspace = workspace.data<float>();
  }
  TESERVE_CUDA_RETURN_IF_ERROR(LaunchActivationBackward(p, StreamOf(ctx)));
  // The workspace is freed (cudaFree, which waits for the device) when it goes out of scope.
  return out;
}

}  // namespace cuda
}  // namespace kernels
}  // namespace teserve
