// Host side of the CUDA scaled softmax: output allocation and launches.
#include "kernels/cuda/softmax/softmax_cuda.h"

#include <cuda_runtime_api.h>

#include "core/status.h"
#include "kernels/cuda/cast/cast_cuda.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_entry.h"
#include "kernels/cuda/scoped_device.h"
#include "kernels/cuda/softmax/softmax_kernels.h"

namespace teserve {
namespace kernels {
namespace cuda {
namespace {

SoftmaxLaunchParams ParamsOf(const Tensor& scores, float scale) {
  SoftmaxLaunchParams p;
  p.batches = scores.dim(0);
  p.heads = scores.dim(1);
  p.sq = scores.dim(2);
  p.sk = scores.dim(3);
  p.scale = scale;
  return p;
}

SoftmaxMaskKind KindOf(SoftmaxMask kind) {
  switch (kind) {
    case SoftmaxMask::kPadding:
      return SoftmaxMaskKind::kPadding;
    case SoftmaxMask::kCausalTopLeft:
      return SoftmaxMaskKind::kCausalTopLeft;
    case SoftmaxMask::kCausalBottomRight:
      return SoftmaxMaskKind::kCausalBottomRight;
    default:
      return SoftmaxMaskKind::kNone;
  }
}

}  // namespace

absl::StatusOr<Tensor> ScaledSoftmaxForward(const Context& ctx, const Tensor& x, float scale, SoftmaxMask kind,
                                            const Tensor& mask) {
  ASSIGN_OR_RETURN(const ScopedDevice device, EnterDevice(ctx.device.index));
  SoftmaxLaunchParams p = ParamsOf(x, scale);
  p.kind = KindOf(kind);
  if (kind == SoftmaxMask::kPadding) p.mask = mask.data<uint8_t>();
  ASSIGN_OR_RETURN(Tensor y, Tensor::Empty(DType::kFloat32, x.shape(), ctx.device, ctx.stream));
  TESERVE_CUDA_RETURN_IF_ERROR(LaunchScaledSoftmaxForward(p, x.data<float>(), y.data<float>(), StreamOf(ctx)));
  return y;
}

absl::StatusOr<Tensor> ScaledSoftmaxBackward(const Context& ctx, const Tensor& y, const Tensor& dy, float scale) {
  ASSIGN_OR_RETURN(const ScopedDevice device, EnterDevice(ctx.device.index));
  const SoftmaxLaunchParams p = ParamsOf(y, scale);
  ASSIGN_OR_RETURN(Tensor dx, Tensor::Empty(DType::kFloat32, y.shape(), ctx.device, ctx.stream));
  TESERVE_CUDA_RETURN_IF_ERROR(
      LaunchScaledSoftmaxBackward(p, y.data<float>(), dy.data<float>(), dx.data<float>(), StreamOf(ctx)));
  return dx;
}

}  // namespace cuda
}  // namespace kernels
}  // namespace teserve
