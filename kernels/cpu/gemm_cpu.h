// CPU reference for kernels/gemm.h: FP32 GEMM through OpenBLAS, bias add and column sums.
//
// Assumes the metadata checks of kernels/gemm.cc have passed (FP32, rank 2 / rank 1,
// consistent shapes, CPU tensors); call the kernels:: entry points for checked use.
#ifndef TESERVE_KERNELS_CPU_GEMM_CPU_H_
#define TESERVE_KERNELS_CPU_GEMM_CPU_H_

#include "absl/status/status.h"
#include "core/context.h"
#include "core/tensor.h"
#include "kernels/gemm.h"

namespace teserve {
namespace kernels {
namespace cpu {

absl::Status Gemm(const Context& ctx, const Tensor& a, bool transpose_a, const Tensor& b,
                  bool transpose_b, float alpha, float beta, Tensor* c);

// kernels/gemm.h's general GEMM: operands decoded to FP32 (FP8 codes times scale_inv),
// sgemm, the epilogue in FP32, then D encoded in its dtype (FP8 after d_scale,
// saturating). Host scale tensors are read directly.
absl::Status Gemm(const Context& ctx, const GemmOperand& a, const GemmOperand& b, Tensor* d,
                  const GemmOptions& options);

absl::Status AddBias(const Context& ctx, const Tensor& bias, Tensor* y);

absl::Status ColumnSum(const Context& ctx, const Tensor& x, bool accumulate, Tensor* out);

}  // namespace cpu
}  // namespace kernels
}  // namespace teserve

#endif  // TESERVE_KERNELS_CPU_GEMM_CPU_H_
