// Checked entry points of kernels/elementwise.h: FP32 tensors on the Context's device
// (errors name the argument and say expected vs got), then the device's kernel.
#include "kernels/elementwise.h"

#include <string>
#include <utility>

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

// The one non-CPU device of `tensors` (CPU when there is none): the device a batched copy
// enters. `field` names the group in errors ("srcs", "dsts", "tensors").
absl::Status OneDevice(absl::string_view field, size_t i, const Tensor& t, Device* device) {
  if (t.device().is_cpu()) return absl::OkStatus();
  if (device->is_cpu()) {
    *device = t.device();
    return absl::OkStatus();
  }
  if (t.device() == *device) return absl::OkStatus();
  return InvalidField(absl::StrCat(field, "[", i, "].device"),
                      absl::StrCat(device->ToString(), " or cpu (one device per batched copy)"), t.device().ToString());
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

absl::Status CopyColumns(const Context& ctx, const Tensor& src, int64_t src_col, Tensor* dst, int64_t dst_col,
                         int64_t cols) {
  RETURN_IF_ERROR(CheckTensor("src", src, src.dtype(), 2, ctx));
  if (dst == nullptr) return InvalidField("dst", "a tensor", "nullptr");
  RETURN_IF_ERROR(CheckTensor("dst", *dst, src.dtype(), 2, ctx));
  if (DTypeBits(src.dtype()) % 8 != 0) return InvalidField("src.dtype", "a type of whole bytes", DTypeName(src.dtype()));
  if (dst->dim(0) != src.dim(0)) {
    return InvalidField("dst.shape", absl::StrCat(src.dim(0), " rows (as src)"), ShapeToString(dst->shape()));
  }
  if (cols < 0 || src_col < 0 || src_col + cols > src.dim(1)) {
    return InvalidField("src_col", absl::StrCat("columns [src_col, src_col + ", cols, ") within ", src.dim(1)), src_col);
  }
  if (dst_col < 0 || dst_col + cols > dst->dim(1)) {
    return InvalidField("dst_col", absl::StrCat("columns [dst_col, dst_col + ", cols, ") within ", dst->dim(1)),
                        dst_col);
  }
  if (cols == 0 || src.dim(0) == 0) return absl::OkStatus();
  return Dispatch("CopyColumns", ctx, [&] { return cpu::CopyColumns(ctx, src, src_col, dst, dst_col, cols); },
                  TESERVE_CUDA_KERNEL([&] { return cuda::CopyColumns(ctx, src, src_col, dst, dst_col, cols); }));
}

absl::StatusOr<Tensor> BiasDropoutAdd(const Context& ctx, const Tensor& h, const Tensor& bias, const Tensor& residual,
                                      const ResidualDropout& dropout) {
  RETURN_IF_ERROR(CheckTensor("h", h, DType::kFloat32, kAnyRank, ctx));
  if (h.rank() < 1) return InvalidField("h.shape", "rank >= 1", ShapeToString(h.shape()));
  RETURN_IF_ERROR(CheckTensor("residual", residual, DType::kFloat32, kAnyRank, ctx));
  RETURN_IF_ERROR(CheckShape("residual", residual, h.shape()));
  if (bias.defined()) {
    RETURN_IF_ERROR(CheckTensor("bias", bias, DType::kFloat32, 1, ctx));
    RETURN_IF_ERROR(CheckShape("bias", bias, {h.shape().back()}));
  }
  if (dropout.active() && (dropout.batch < 1 || dropout.seq < 1)) {
    return InvalidField("dropout.batch", ">= 1 (and seq >= 1)", absl::StrCat(dropout.batch, ", ", dropout.seq));
  }
  ASSIGN_OR_RETURN(Tensor out, Tensor::Empty(DType::kFloat32, h.shape(), ctx.device, ctx.stream));
  if (h.numel() == 0) return out;
  RETURN_IF_ERROR(Dispatch("BiasDropoutAdd", ctx, [&] { return cpu::BiasDropoutAdd(ctx, h, bias, residual, dropout, &out); },
                           TESERVE_CUDA_KERNEL([&] {
                             return cuda::BiasDropoutAdd(ctx, h, bias, residual, dropout, &out);
                           })));
  return out;
}

absl::Status DropoutScale(const Context& ctx, const ResidualDropout& dropout, Tensor* x) {
  RETURN_IF_ERROR(CheckOutput("x", x, ctx));
  if (x->rank() < 1) return InvalidField("x.shape", "rank >= 1", ShapeToString(x->shape()));
  if (!dropout.active() || x->numel() == 0) return absl::OkStatus();
  if (dropout.batch < 1 || dropout.seq < 1) {
    return InvalidField("dropout.batch", ">= 1 (and seq >= 1)", absl::StrCat(dropout.batch, ", ", dropout.seq));
  }
  return Dispatch("DropoutScale", ctx, [&] { return cpu::DropoutScale(ctx, dropout, x); },
                  TESERVE_CUDA_KERNEL([&] { return cuda::DropoutScale(ctx, dropout, x); }));
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

absl::Status CopyManyInto(const Context& ctx, absl::Span<const Tensor* const> srcs, absl::Span<Tensor* const> dsts,
                          int64_t chunk_bytes) {
  if (chunk_bytes <= 0) return InvalidField("chunk_bytes", "> 0", chunk_bytes);
  if (srcs.size() != dsts.size()) {
    return InvalidField("dsts.size", absl::StrCat(srcs.size(), " (one per src)"), dsts.size());
  }
  Device device = Device::Cpu();
  for (size_t i = 0; i < srcs.size(); ++i) {
    const std::string src_name = absl::StrCat("srcs[", i, "]");
    const std::string dst_name = absl::StrCat("dsts[", i, "]");
    if (srcs[i] == nullptr) return InvalidField(src_name, "a tensor", "nullptr");
    if (dsts[i] == nullptr) return InvalidField(dst_name, "a tensor", "nullptr");
    const Tensor& src = *srcs[i];
    const Tensor& dst = *dsts[i];
    RETURN_IF_ERROR(CheckDefined(src_name, src));
    RETURN_IF_ERROR(CheckDefined(dst_name, dst));
    if (dst.dtype() != src.dtype()) {
      return InvalidField(absl::StrCat(dst_name, ".dtype"), DTypeName(src.dtype()), DTypeName(dst.dtype()));
    }
    RETURN_IF_ERROR(CheckShape(dst_name, dst, src.shape()));
    RETURN_IF_ERROR(OneDevice("srcs", i, src, &device));
    RETURN_IF_ERROR(OneDevice("dsts", i, dst, &device));
  }
  if (device.is_cpu()) {
    for (size_t i = 0; i < srcs.size(); ++i) RETURN_IF_ERROR(cpu::CopyInto(ctx, *srcs[i], dsts[i]));
    return absl::OkStatus();
  }
#if TESERVE_WITH_CUDA
  return cuda::CopyManyInto(ctx, device, srcs, dsts, chunk_bytes);
#else
  return NoKernel("CopyManyInto", device, kNoCudaBackend);
#endif
}

absl::StatusOr<std::vector<Tensor>> CopyManyTo(const Context& ctx, absl::Span<const Tensor* const> tensors,
                                               Device device, int64_t chunk_bytes) {
  if (chunk_bytes <= 0) return InvalidField("chunk_bytes", "> 0", chunk_bytes);
  for (size_t i = 0; i < tensors.size(); ++i) {
    const std::string name = absl::StrCat("tensors[", i, "]");
    if (tensors[i] == nullptr) return InvalidField(name, "a tensor", "nullptr");
    RETURN_IF_ERROR(CheckDefined(name, *tensors[i]));
  }
  if (!device.is_cpu()) {
#if TESERVE_WITH_CUDA
    // The outputs are allocated on the device (under its allocator) by the backend.
    Device other = device;
    for (size_t i = 0; i < tensors.size(); ++i) RETURN_IF_ERROR(OneDevice("tensors", i, *tensors[i], &other));
    return cuda::CopyManyTo(ctx, tensors, device, chunk_bytes);
#else
    return NoKernel("CopyManyTo", device, kNoCudaBackend);
#endif
  }
  std::vector<Tensor> out;
  out.reserve(tensors.size());
  std::vector<Tensor*> dsts;
  dsts.reserve(tensors.size());
  for (const Tensor* t : tensors) {
    ASSIGN_OR_RETURN(Tensor copy, Tensor::Empty(t->dtype(), t->shape(), Device::Cpu(), nullptr));
    out.push_back(std::move(copy));
  }
  for (Tensor& t : out) dsts.push_back(&t);
  RETURN_IF_ERROR(CopyManyInto(ctx, tensors, dsts, chunk_bytes));
  return out;
}

}  // namespace kernels
}  // namespace teserve
