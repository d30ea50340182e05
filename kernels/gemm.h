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

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
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
// algorithm chosen by its heuristic once per problem (with TESERVE_GEMM_AUTOTUNE=1, the
// fastest of its first 8 candidates, timed once per problem on scratch output; off by
// default, since a timed choice can differ between processes and with it the bits).
//
// FP8 block scaling (TE's Float8BlockScaling, DeepSeek-V3 style), GemmOperand::scale_mode:
//   kBlock1D   one FP32 scale_inv per 1x128 block of a stored row (along k)
//   kBlock2D   one FP32 scale_inv per 128x128 tile of the stored matrix
// An operand [R, C] (C = k, contiguous: the TN layout above) decodes as
// code[r][c] * s(r, c), one FP32 product, exactly kernels::DequantizeBlock's value, with
// s(r, c) = scale_inv[r][c / 128] (1D) or scale_inv[r / 128][c / 128] (2D). Tails are
// partial blocks (R and C need not be multiples of 128). scale_inv is given either
//   kQuantizer: as QuantizeBlockScaling produced that copy, FP32 [R, ceil(C/128)] (1D)
//               or [ceil(R/128), ceil(C/128)] (2D); the CUDA path converts it with
//               BlockScalesGemmLayout into stream-ordered scratch on every call, or
//   kGemm:      already in that layout (kernels/block_quantize.h), FP32
//               [ceil(C/128), roundup(R, 4)] (1D, R contiguous) or
//               [ceil(R/128), roundup(ceil(C/128), 4)] (2D), for callers that keep
//               scales in GEMM layout (no conversion; the benchmark's pure GEMM).
// On CUDA these are cuBLASLt's CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F and _BLK128x128_32F
// scale modes (cuBLASLt >= 12.9, Hopper only: sm_90; BlockScaledGemmSupport says why
// not elsewhere, as UNIMPLEMENTED). What cuBLASLt runs, and so what both backends
// accept (INVALID_ARGUMENT naming the field otherwise):
//   - both operands block-scaled FP8 (no mixing with per-tensor), 1D x 1D, 1D x 2D or
//     2D x 1D (2D x 2D has no kernel); the recipe's pairs are x (1D) x W (2D) for fprop,
//     dy (1D) x W^T (2D, W's columnwise copy) for dgrad, dy^T (1D) x x^T (1D) for wgrad;
//   - TN layout as for per-tensor FP8 (a not transposed, b transposed), k % 16 == 0;
//   - n % 8 == 0 (D's row, 16-byte aligned for BF16), and m % 8 == 0 when a is 1D;
//   - D FLOAT32 or BFLOAT16; no d_amax; epilogue kNone or kBias; beta allowed;
//   - accumulation kSplit: block-scaled kernels always promote partial sums to FP32
//     after each 128-deep k block (there is no fast-accumulation variant; cuBLASLt
//     refuses FAST_ACCUM with these scale modes), so kFast is rejected.
//
// MXFP8 (TE's MXFP8BlockScaling), GemmOperand::scale_mode kMxfp8: one E8M0 scale per 1x32
// block of a stored row (along k), decoding as code[r][c] * 2^(e(r, c / 32) - 127), one
// FP32 product (kernels::DequantizeBlock's value; E8M0 0xFF is NaN). scale_inv is
// DType::kFloat8E8M0, given either
//   kQuantizer: as QuantizeMxfp8 produced that copy, [R, C / 32] (converted on CUDA with
//               SwizzleMxfp8Scales into stream-ordered scratch on every call), or
//   kGemm:      already swizzled (kernels/block_quantize.h), [roundup(R, 128),
//               roundup(C / 32, 4)].
// On CUDA this is cuBLASLt's CUBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE8M0 mode, whose kernels
// exist only on Blackwell (compute capability 10.0+) with cuBLASLt >= 12.8
// (MicroScaledGemmSupport; Hopper has none: there MXFP8 runs emulated, layers/linear.cc).
// Both backends accept: both operands kMxfp8, TN as above, C % 32 == 0 (k in whole
// blocks), n % 8 == 0 and m % 8 == 0, D FLOAT32 or BFLOAT16, epilogue kNone or kBias,
// beta allowed, no d_amax, accumulation kSplit.
//
// NVFP4 (TE's NVFP4BlockScaling), kNvfp4_1D / kNvfp4_2D: data DType::kFloat4E2M1 (two codes
// a byte, kernels/nvfp4.h), E4M3 scales per 1x16 block of a stored row (1D) or per 16x16
// block (2D, weights), decoding as e2m1(code) * e4m3(scale), one FP32 product. The
// per-tensor decode scales (kernels/nvfp4.h's inv_S) are not part of the operand: callers
// fold them into alpha, as cuBLASLt does. scale_inv is DType::kFloat8E4M3, given either
//   kQuantizer: as QuantizeNvfp4 produced that copy, [R, C / 16] (1D) or
//               [R / 16, C / 16] (2D), swizzled on CUDA per call (2D rows repeated 16
//               times: cuBLASLt reads per-row scales), or
//   kGemm:      already swizzled per row, [roundup(R, 128), roundup(C / 16, 4)], either mode.
// On CUDA this is CUBLASLT_MATMUL_MATRIX_SCALE_VEC16_UE4M3 with CUDA_R_4F_E2M1 operands,
// under the same device rule as MXFP8. Both backends accept: both operands NVFP4 (1D or
// 2D in any pair), TN, C % 32 == 0 (16-byte rows), R % 16 == 0 for a 2D operand, and the
// MXFP8 rules above for m, n, D, epilogue, beta, d_amax and accumulation.
enum class GemmEpilogue { kNone, kBias, kGeluAuxBias, kDGeluBGrad, kBGradB };

// Fast accumulation lets FP8 tensor cores keep partial sums in reduced precision over
// the whole k loop; split accumulation promotes them to FP32 periodically. Fast is
// what fprop uses; dgrad and wgrad use split (their sums run over longer k). Only FP8
// operands are affected.
enum class GemmAccumulation { kSplit, kFast };

// How an FP8 operand's scale_inv applies (see above). kPerTensor: FP32 [1].
enum class GemmScaleMode { kPerTensor, kBlock1D, kBlock2D, kMxfp8, kNvfp4_1D, kNvfp4_2D };
// Which layout a block scale_inv is given in (ignored for kPerTensor, which must leave
// it kQuantizer).
enum class GemmScaleLayout { kQuantizer, kGemm };

inline constexpr int64_t kGemmBlockSize = 128;  // FP8 block scaling: 1x128 / 128x128
inline constexpr int64_t kGemmMxfp8BlockSize = 32;  // MXFP8: 1x32
inline constexpr int64_t kGemmNvfp4BlockSize = 16;  // NVFP4: 1x16 / 16x16

struct GemmOperand {
  Tensor data;       // rank 2, row-major as stored
  bool transpose = false;
  Tensor scale_inv;  // FP8 only, FP32 on data's device: the dequantization factors
  GemmScaleMode scale_mode = GemmScaleMode::kPerTensor;
  GemmScaleLayout scale_layout = GemmScaleLayout::kQuantizer;
};

struct GemmOptions {
  float alpha = 1.0f;
  float beta = 0.0f;  // beta != 0 accumulates into D (not an FP8 D; epilogue kNone or kBGradB)
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

// The metadata checks Gemm starts with, alone: OK exactly when Gemm would accept the
// call's shapes, dtypes, layouts and options (the same INVALID_ARGUMENT otherwise).
// Callers with a fallback (Linear's block-scaled GEMMs) ask before choosing a path.
absl::Status CheckGemmArguments(const Context& ctx, const GemmOperand& a, const GemmOperand& b, const Tensor* d,
                                const GemmOptions& options = GemmOptions());

// Whether block-scaled FP8 GEMMs can run on ctx's device: OK on the CPU (the reference)
// and on a CUDA device of compute capability 9.x with a cuBLASLt of at least 12.9 both
// at build time (the scale modes' header) and at run time; UNIMPLEMENTED saying which
// fact is missing otherwise (callers such as Linear then dequantize instead).
absl::Status BlockScaledGemmSupport(const Context& ctx);

// The rule behind it, from facts: compute capability and cuBLASLt's version number
// (major * 10000 + minor * 100 + patch, as cublasLtGetVersion returns it). Hopper only:
// cuBLASLt offers VEC128_32F / BLK128x128_32F on sm_90; Blackwell's block-scaled tensor
// cores take MXFP8's E8M0 scales instead (TE emulates this recipe there).
inline constexpr int64_t kBlockScaledGemmMinCublasLt = 120900;
inline absl::Status BlockScaledGemmSupportFor(int cc_major, int cc_minor, int64_t cublaslt_version) {
  if (cc_major != 9) {
    return absl::UnimplementedError(absl::StrCat(
        "FP8 block-scaled GEMMs (cuBLASLt VEC128_32F / BLK128x128_32F scale modes) run only on "
        "compute capability 9.x (Hopper); this device is sm_",
        cc_major, cc_minor));
  }
  if (cublaslt_version < kBlockScaledGemmMinCublasLt) {
    return absl::UnimplementedError(absl::StrCat("FP8 block-scaled GEMMs need cuBLASLt >= 12.9 (version ",
                                                 kBlockScaledGemmMinCublasLt, "); the loaded one is version ",
                                                 cublaslt_version));
  }
  return absl::OkStatus();
}

// Whether MXFP8 and NVFP4 GEMMs (kMxfp8, kNvfp4_* operands) can run on ctx's device: OK
// on the CPU (the reference) and on a CUDA device of compute capability 10.0+ with a
// cuBLASLt of at least 12.8 at build and at run time, unless
// TESERVE_NATIVE_MICROSCALED_GEMM=0 turns the native path off (it has no Blackwell run
// behind it in this repository's results yet); UNIMPLEMENTED saying which fact is missing
// otherwise (Linear then dequantizes, as on Hopper).
absl::Status MicroScaledGemmSupport(const Context& ctx);

inline constexpr int64_t kMicroScaledGemmMinCublasLt = 120800;
inline absl::Status MicroScaledGemmSupportFor(int cc_major, int cc_minor, int64_t cublaslt_version) {
  if (cc_major < 10) {
    return absl::UnimplementedError(absl::StrCat(
        "MXFP8 / NVFP4 GEMMs (cuBLASLt VEC32_UE8M0 / VEC16_UE4M3 scale modes) run only on compute capability "
        "10.0+ (Blackwell); this device is sm_",
        cc_major, cc_minor));
  }
  if (cublaslt_version < kMicroScaledGemmMinCublasLt) {
    return absl::UnimplementedError(absl::StrCat("MXFP8 / NVFP4 GEMMs need cuBLASLt >= 12.8 (version ",
                                                 kMicroScaledGemmMinCublasLt, "); the loaded one is version ",
                                                 cublaslt_version));
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------
// The FP32 GEMM of the CPU layers (the general one with FP32 operands and D).

absl::Status Gemm(const Context& ctx, const Tensor& a, bool transpose_a, const Tensor& b,
                  bool transpose_b, float alpha, float beta, Tensor* c);

absl::Status AddBias(const Context& ctx, const Tensor& bias, Tensor* y);

absl::Status ColumnSum(const Context& ctx, const Tensor& x, bool accumulate, Tensor* out);

}  // namespace kernels
}  // namespace teserve

#endif  // TESERVE_KERNELS_GEMM_H_
