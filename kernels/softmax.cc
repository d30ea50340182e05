// Checked entry points of kernels/softmax.h: validate metadata (errors name the argument
// and say expected vs got), then run the CPU reference or, for tensors on a CUDA device,
// kernels/cuda.
#include "kernels/softmax.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "kernels/cpu/softmax_cpu.h"
#include "kernels/dispatch.h"
#include "kernels/tensor_checks.h"

#if TESERVE_WITH_CUDA
#include "kernels/cuda/softmax/softmax_cuda.h"
#endif

namespace teserve {
namespace kernels {
namespace {

absl::Status CheckScale(float scale) {
  if (std::isfinite(scale)) return absl::OkStatus();
  return InvalidField("scale", "a finite value", scale);
}

}  // namespace

const char* SoftmaxMaskName(SoftmaxMask kind) {
  switch (kind) {
    case SoftmaxMask::kNone:
      return "none";
    case SoftmaxMask::kPadding:
      return "padding";
    case SoftmaxMask::kCausalTopLeft:
      return "causal_top_left";
    case SoftmaxMask::kCausalBottomRight:
      return "causal_bottom_right";
  }
  return "unknown";
}

absl::StatusOr<Tensor> ScaledSoftmaxForward(const Context& ctx, const Tensor& x, float scale, SoftmaxMask kind,
                                            const Tensor& mask) {
  RETURN_IF_ERROR(CheckTensor("x", x, DType::kFloat32, 4, ctx));
  RETURN_IF_ERROR(CheckScale(scale));
  switch (kind) {
    case SoftmaxMask::kNone:
    case SoftmaxMask::kCausalTopLeft:
    case SoftmaxMask::kCausalBottomRight:
      if (mask.defined()) {
        return InvalidField("mask", absl::StrCat("no mask for kind ", SoftmaxMaskName(kind)), "a mask tensor");
      }
      break;
    case SoftmaxMask::kPadding:
      if (!mask.defined()) {
        return InvalidField("mask", "a BOOL [batches, 1, sq, sk] mask for kind padding", "no mask");
      }
      RETURN_IF_ERROR(CheckTensorOfShape("mask", mask, DType::kBool, {x.dim(0), 1, x.dim(2), x.dim(3)}, ctx));
      break;
    default:
      return InvalidField("kind", "none, padding, causal_top_left or causal_bottom_right",
                          static_cast<int>(kind));
  }
  return Dispatch("ScaledSoftmaxForward", ctx, [&] { return cpu::ScaledSoftmaxForward(x, scale, kind, mask); },
                  TESERVE_CUDA_KERNEL([&] { return cuda::ScaledSoftmaxForward(ctx, x, scale, kind, mask); }));
}

absl::StatusOr<Tensor> ScaledSoftmaxBackward(const Context& ctx, const Tensor& y, const Tensor& dy, float scale) {
  RETURN_IF_ERROR(CheckTensor("y", y, DType::kFloat32, 4, ctx));
  RETURN_IF_ERROR(CheckTensorOfShape("dy", dy, DType::kFloat32, y.shape(), ctx));
  RETURN_IF_ERROR(CheckScale(scale));
  return Dispatch("ScaledSoftmaxBackward", ctx, [&] { return cpu::ScaledSoftmaxBackward(y, dy, scale); },
                  TESERVE_CUDA_KERNEL([&] { return cuda::ScaledSoftmaxBackward(ctx, y, dy, scale); }));
}

}  // namespace kernels
}  // namespace teserve
