// Checked entry points of kernels/elementwise.h: FP32 tensors on the Context's device
// (errors name the argument and say expected vs got), then the device's kernel.
#include "kernels/elementwise.h"

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "kernels/cpu/elementwise_cpu.h"
#include "kernels/dispatch.h"
#include "kernels/tensor_checks.h"

#if TESERVE_WITH_CUDA
#include "kernels/cuda/elementwise/elementwise_cuda.h"
#endif

namespace teserve {
namespace kernels {
namespace {

absl::Status CheckOutput(absl::string_view name, const Tensor* t, const Context& ctx) {
  if (t == nullptr) return InvalidField(name, "a tensor", "nullptr");
  return CheckTensor(name, *t, DType::kFloat32, kAnyRank, ctx);
}

}  // namespace

absl::Status AddInto(const Context& ctx, const Tensor& x, Tensor* into) {
  RETURN_IF_ERROR(CheckTensor("x", x, DType::kFloat32, kAnyRank, ctx));
  RETURN_IF_ERROR(CheckOutput("into", into, ctx));
  if (x.shape() != into->shape()) {
    return InvalidField("into.shape", absl::StrCat(ShapeToString(x.shape()), " (the shape of x)"),
                        ShapeToString(into->shape()));
  }
  return Dispatch("AddInto", ctx, [&] { return cpu::AddInto(ctx, x, into); },
                  TESERVE_CUDA_KERNEL([&] { return cuda::AddInto(ctx, x, into); }));
}

absl::Status Scale(const Context& ctx, float factor, Tensor* x) {
  RETURN_IF_ERROR(CheckOutput("x", x, ctx));
  return Dispatch("Scale", ctx, [&] { return cpu::Scale(ctx, factor, x); },
                  TESERVE_CUDA_KERNEL([&] { return cuda::Scale(ctx, factor, x); }));
}

absl::StatusOr<double> SumOfSquares(const Context& ctx, absl::Span<const Tensor> tensors) {
  for (size_t i = 0; i < tensors.size(); ++i) {
    RETURN_IF_ERROR(CheckTensor(absl::StrCat("tensors[", i, "]"), tensors[i], DType::kFloat32, kAnyRank, ctx));
  }
  return Dispatch("SumOfSquares", ctx, [&] { return cpu::SumOfSquares(ctx, tensors); },
                  TESERVE_CUDA_KERNEL([&] { return cuda::SumOfSquares(ctx, tensors); }));
}

absl::Status FillZero(const Context& ctx, Tensor* x) {
  if (x == nullptr) return InvalidField("x", "a tensor", "nullptr");
  RETURN_IF_ERROR(CheckDefined("x", *x));
  RETURN_IF_ERROR(CheckDevice("x", *x, ctx));
  return Dispatch("FillZero", ctx, [&] { return cpu::FillZero(ctx, x); },
                  TESERVE_CUDA_KERNEL([&] { return cuda::FillZero(ctx, x); }));
}

absl::Status CopyInto(const Context& ctx, const Tensor& src, Tensor* dst) {
  RETURN_IF_ERROR(CheckDefined("src", src));
  if (dst == nullptr) return InvalidField("dst", "a tensor", "nullptr");
  RETURN_IF_ERROR(CheckDefined("dst", *dst));
  if (dst->dtype() != src.dtype()) return InvalidField("dst.dtype", DTypeName(src.dtype()), DTypeName(dst->dtype()));
  RETURN_IF_ERROR(CheckShape("dst", *dst, src.shape()));
  if (src.device().is_cpu() && dst->device().is_cpu()) return cpu::CopyInto(ctx, src, dst);
#if TESERVE_WITH_CUDA
  return cuda::CopyInto(ctx, src, dst);
#else
  return NoKernel("CopyInto", src.device().is_cpu() ? dst->device() : src.device(), kNoCudaBackend);
#endif
}

absl::StatusOr<Tensor> CopyTo(const Context& ctx, const Tensor& t, Device device) {
  RETURN_IF_ERROR(CheckDefined("t", t));
  if (t.device() == device) return t;
  if (t.device().is_cpu() && device.is_cpu()) return t.Clone();
#if TESERVE_WITH_CUDA
  return cuda::CopyTo(ctx, t, device);
#else
  return NoKernel("CopyTo", t.device().is_cpu() ? device : t.device(), kNoCudaBackend);
#endif
}

}  // namespace kernels
}  // namespace teserve
