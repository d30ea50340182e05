// GEMM and the bias helpers of Linear.
//
//   Gemm:      C = alpha * op(A) * op(B) + beta * C, FP32 row-major; op(X) = X or X^T.
//              op(A) is [m, k], op(B) is [k, n], C is [m, n] and must be allocated
//              (beta = 0 ignores its contents, NaN included).
//   AddBias:   y[i, j] += bias[j] for y [m, n], bias [n].
//   ColumnSum: out[j] (+)= sum_i x[i, j] for x [m, n], out [n]; accumulate adds to out.
// Linear's GEMMs (y = x W^T + b, W [out, in]):
//   fprop y  = x W^T    Gemm(x, false, W, true)
//   dgrad dx = dy W     Gemm(dy, false, W, false)
//   wgrad dW = dy^T x   Gemm(dy, true, x, false)
// On the CPU the operands are FP32 (quantized operands are dequantized first) and the
// product runs through OpenBLAS sgemm.
#ifndef TESERVE_KERNELS_GEMM_H_
#define TESERVE_KERNELS_GEMM_H_

#include "absl/status/status.h"
#include "core/context.h"
#include "core/tensor.h"

namespace teserve {
namespace kernels {

absl::Status Gemm(const Context& ctx, const Tensor& a, bool transpose_a, const Tensor& b,
                  bool transpose_b, float alpha, float beta, Tensor* c);

absl::Status AddBias(const Context& ctx, const Tensor& bias, Tensor* y);

absl::Status ColumnSum(const Context& ctx, const Tensor& x, bool accumulate, Tensor* out);

}  // namespace kernels
}  // namespace teserve

#endif  // TESERVE_KERNELS_GEMM_H_
