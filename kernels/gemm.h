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

// ---------------------------------------------------------------------------------------
// The general GEMM: D = epilogue(alpha * op(A) * op(B) + beta * D), row-major.
//
// Operands are stored row-major; op(X) = X or X^T. op(A) is [m, k], op(B) is [k, n], D is
// [m, n]. Operand dtypes: FLOAT32, BFLOAT16, FLOAT16 (both operands the same), or FP8
// (E4M3 x E4M3, E4M3 x E5M2, E5M2 x E4M3) with a per-tensor FP32 scale_inv [1] each,
// read where it lives (no dequantized copy): D = alpha * (A_q * sa) (B_q * sb)^T.
// FP8 GEMMs take the layout the tensor cores read, with k contiguous in both operands:
// A [m, k] not transposed and B [n, k] transposed (Linear's fprop x W^T; dgrad and
// wgrad pass the columnwise copies, which is why quantizers produce them), and the
// stored row lengths (k) must be multiples of 16.
// D: FLOAT32, BFLOAT16 or FLOAT16; for FP8 operands also E4M3 / E5M2 (E5M2 only when an
// operand is E5M2, as in cuBLASLt's FP8 type table), quantized with
// d_scale (FP32 [1]): D_q = cast(D * d_scale). d_amax (FP32 [1]) receives max |D| before
// that scaling (FP8 operands only). Accumulation is always FP32.
//
// Epilogues (named after cuBLASLt's; meanings in this row-major convention):
//   kBias         D = op(A) op(B) + bias[n]
//   kGeluAuxBias  aux = op(A) op(B) + bias[n] (the pre-activation, [m, n], D's dtype),
//                 D = gelu_tanh(aux): fc1 of LayerNormMLP
//   kDGeluBGrad   D = (op(A) op(B)) * gelu_tanh'(aux), bias_grad[n] = sum over m of D:
//                 the dgrad of fc2 feeding fc1's backward
//   kBGradB       bias_grad[m] = sum over k of op(A): the wgrad dW = dy^T x with the
//                 bias gradient of dy in the same pass
// bias is [n] and bias_grad [n] (kDGeluBGrad) or [m] (kBGradB), each FP32 or D's dtype
// (BF16 for an FP8 D); cuBLASLt's kernels for 16-bit D want them in D's dtype. An empty
// product (m, n or k 0) takes no epilogue and no d_amax.
//
// On the CPU every operand is decoded to FP32 (x * scale_inv for FP8), multiplied with
// sgemm and the epilogue applied in FP32: the numerical reference of the CUDA path.
// On CUDA it runs through cuBLASLt with a 32 MiB workspace per (device, stream) and the
// algorithm chosen by its heuristic once per problem.
enum class GemmEpilogue { kNone, kBias, kGeluAuxBias, kDGeluBGrad, kBGradB };

// Fast accumulation lets FP8 tensor cores keep partial sums in reduced precision over
// the whole k loop; split accumulation promotes them to FP32 periodically. Fast is
// what fprop uses; dgrad and wgrad use split (their sums run over longer k). Only FP8
// operands are affected.
enum class GemmAccumulation { kSplit, kFast };

struct GemmOperand {
  Tensor data;       // rank 2, row-major as stored
  bool transpose = false;
  Tensor scale_inv;  // FP8 only: FP32 [1] on data's device, the dequantization factor
};

struct GemmOptions {
  float alpha = 1.0f;
  float beta = 0.0f;  // beta != 0 accumulates into D (not an FP8 D)
  GemmAccumulation accumulation = GemmAccumulation::kSplit;
  GemmEpilogue epilogue = GemmEpilogue::kNone;
  const Tensor* bias = nullptr;  // kBias, kGeluAuxBias
  Tensor* aux = nullptr;         // kGeluAuxBias: written; kDGeluBGrad: read
  Tensor* bias_grad = nullptr;   // kDGeluBGrad, kBGradB: written
  const Tensor* d_scale = nullptr;  // FP8 D: FP32 [1]
  Tensor* d_amax = nullptr;         // optional, FP8 operands: FP32 [1]
};

absl::Status Gemm(const Context& ctx, const GemmOperand& a, const GemmOperand& b, Tensor* d,
                  const GemmOptions& options = GemmOptions());

// ---------------------------------------------------------------------------------------
// The FP32 GEMM of the CPU layers (the general one with FP32 operands and D).

absl::Status Gemm(const Context& ctx, const Tensor& a, bool transpose_a, const Tensor& b,
                  bool transpose_b, float alpha, float beta, Tensor* c);

absl::Status AddBias(const Context& ctx, const Tensor& bias, Tensor* y);

absl::Status ColumnSum(const Context& ctx, const Tensor& x, bool accumulate, Tensor* out);

}  // namespace kernels
}  // namespace teserve

#endif  // TESERVE_KERNELS_GEMM_H_
