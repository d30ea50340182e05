// Checked entry points of kernels/gemm.h: validate metadata (FP32, ranks, the m/n/k
// agreement of the operands, devices; errors name the argument and say expected vs
// got), then run the CPU reference. The CUDA GEMM (cuBLASLt) is not wired in yet, so
// CUDA contexts get UNIMPLEMENTED naming the op.
#include "kernels/gemm.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "kernels/cpu/gemm_cpu.h"
#include "kernels/dispatch.h"
#include "kernels/tensor_checks.h"
#include "kernels/timing.h"

namespace teserve {
namespace kernels {
namespace {

absl::Status CheckFloatTensor(absl::string_view name, const Tensor& t, int rank, const Context& ctx) {
  return CheckTensor(name, t, DType::kFloat32, rank, ctx);
}

absl::Status CheckOutput(absl::string_view name, const Tensor* t, int rank, const Context& ctx) {
  if (t == nullptr) return InvalidField(name, "an allocated output tensor", "nullptr");
  return CheckFloatTensor(name, *t, rank, ctx);
}

std::string Described(const Tensor& t, bool transposed) {
  return absl::StrCat(ShapeToString(t.shape()), transposed ? " (transposed)" : "");
}

absl::Status CheckGemmShapes(const Tensor& a, bool transpose_a, const Tensor& b, bool transpose_b,
                             const Tensor& c) {
  const int64_t m = transpose_a ? a.dim(1) : a.dim(0);
  const int64_t k = transpose_a ? a.dim(0) : a.dim(1);
  const int64_t kb = transpose_b ? b.dim(1) : b.dim(0);
  const int64_t n = transpose_b ? b.dim(0) : b.dim(1);
  if (kb != k) {
    return InvalidField("b.shape", absl::StrCat("op(b) with ", k, " rows to match op(a) = ",
                                                Described(a, transpose_a), " [m, k]"),
                        Described(b, transpose_b));
  }
  if (c.dim(0) != m || c.dim(1) != n) {
    return InvalidField("c.shape", ShapeToString({m, n}), ShapeToString(c.shape()));
  }
  if (c.numel() > 0 && (c.raw_data() == a.raw_data() || c.raw_data() == b.raw_data())) {
    return InvalidField("c", "a buffer distinct from a and b", "an aliased buffer");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status Gemm(const Context& ctx, const Tensor& a, bool transpose_a, const Tensor& b,
                  bool transpose_b, float alpha, float beta, Tensor* c) {
  RETURN_IF_ERROR(CheckFloatTensor("a", a, 2, ctx));
  RETURN_IF_ERROR(CheckFloatTensor("b", b, 2, ctx));
  RETURN_IF_ERROR(CheckOutput("c", c, 2, ctx));
  RETURN_IF_ERROR(CheckGemmShapes(a, transpose_a, b, transpose_b, *c));
  ScopedKernelTimer timer(ctx, KernelOp::kGemm);
  return Dispatch("Gemm", ctx, [&] { return cpu::Gemm(ctx, a, transpose_a, b, transpose_b, alpha, beta, c); },
                  kNoCudaKernel);
}

absl::Status AddBias(const Context& ctx, const Tensor& bias, Tensor* y) {
  RETURN_IF_ERROR(CheckFloatTensor("bias", bias, 1, ctx));
  RETURN_IF_ERROR(CheckOutput("y", y, 2, ctx));
  if (bias.dim(0) != y->dim(1)) {
    return InvalidField("bias.shape", ShapeToString({y->dim(1)}), ShapeToString(bias.shape()));
  }
  return Dispatch("AddBias", ctx, [&] { return cpu::AddBias(ctx, bias, y); }, kNoCudaKernel);
}

absl::Status ColumnSum(const Context& ctx, const Tensor& x, bool accumulate, Tensor* out) {
  RETURN_IF_ERROR(CheckFloatTensor("x", x, 2, ctx));
  RETURN_IF_ERROR(CheckOutput("out", out, 1, ctx));
  if (out->dim(0) != x.dim(1)) {
    return InvalidField("out.shape", ShapeToString({x.dim(1)}), ShapeToString(out->shape()));
  }
  return Dispatch("ColumnSum", ctx, [&] { return cpu::ColumnSum(ctx, x, accumulate, out); }, kNoCudaKernel);
}

}  // namespace kernels
}  // namespace teserve
