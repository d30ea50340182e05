// Checked entry points of kernels/l2_norm.h: validate metadata (FP32; x and dy [n, h]
// with h > 0; rsigma [n]; eps finite and >= 0; devices; errors name the argument and
// say expected vs got), then the device's kernel (CPU reference or
// kernels/cuda/elementwise).
#include "kernels/l2_norm.h"

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "kernels/cpu/l2_norm_cpu.h"
#include "kernels/dispatch.h"
#include "kernels/tensor_checks.h"

#if TESERVE_WITH_CUDA
#include "kernels/cuda/elementwise/elementwise_cuda.h"
#endif

namespace teserve {
namespace kernels {
namespace {

absl::Status CheckInput(absl::string_view name, const Tensor& x, const Context& ctx) {
  RETURN_IF_ERROR(CheckTensor(name, x, DType::kFloat32, 2, ctx));
  if (x.dim(1) == 0) {
    return InvalidField(absl::StrCat(name, ".shape"), "[n, h] with h > 0", ShapeToString(x.shape()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<L2NormForwardOutputs> L2NormalizationForward(const Context& ctx, const Tensor& x, float eps) {
  RETURN_IF_ERROR(CheckInput("x", x, ctx));
  RETURN_IF_ERROR(CheckFiniteNonNegative("eps", eps));
  return Dispatch("L2NormalizationForward", ctx, [&] { return cpu::L2NormalizationForward(ctx, x, eps); },
                  TESERVE_CUDA_KERNEL([&] { return cuda::L2NormalizationForward(ctx, x, eps); }));
}

absl::StatusOr<Tensor> L2NormalizationBackward(const Context& ctx, const Tensor& dy, const Tensor& x,
                                               const Tensor& rsigma) {
  RETURN_IF_ERROR(CheckInput("x", x, ctx));
  RETURN_IF_ERROR(CheckTensorOfShape("dy", dy, DType::kFloat32, x.shape(), ctx));
  RETURN_IF_ERROR(CheckTensorOfShape("rsigma", rsigma, DType::kFloat32, {x.dim(0)}, ctx));
  return Dispatch("L2NormalizationBackward", ctx, [&] { return cpu::L2NormalizationBackward(ctx, dy, x, rsigma); },
                  TESERVE_CUDA_KERNEL([&] { return cuda::L2NormalizationBackward(ctx, dy, x, rsigma); }));
}

}  // namespace kernels
}  // namespace teserve
