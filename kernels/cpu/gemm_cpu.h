// CPU reference for kernels/gemm.h: FP32 GEMM through OpenBLAS, bias add and column sums.
//
// Assumes the metadata checks of kernels/gemm.cc have passed (FP32, rank 2 / rank 1,
// consistent shapes, CPU tensors); call the kernels:: entry points for checked use.
#ifndef TESERVE_KERNELS_CPU_GEMM_CPU_H_
#define TESERVE_KERNELS_CPU_GEMM_CPU_H_

#include "absl/status/status.h"
#include "core/context.h"
#include "core/tensor.h"

namespace teserve {
namespace kernels {
namespace cpu {

absl::Status Gemm(const Context& ctx, const Tensor& a, bool transpose_a, const Tensor& b,
                  bool transpose_b, float alpha, float beta, Tensor* c);

absl::Status AddBias(const Context& ctx, const Tensor& bias, Tensor* y);

absl::Status ColumnSum(const Context& ctx, const Tensor& x, bool accumulate, Tensor* out);

}  // namespace cpu
}  // namespace kernels
}  // namespace teserve

#endif  // TESERVE_KERNELS_CPU_GEMM_CPU_H_
