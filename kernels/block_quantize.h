// Block-scaled FP8 quantization: MXFP8 (E8M0 scale per 32 elements) and FP8 block
// scaling (FP32 scale per 1x128 or 128x128 block, DeepSeek-V3 style), their
// dequantization, and the scale layouts cuBLASLt wants.
//
// Conventions. x is FP32 [rows, cols]. The rowwise copy is [rows, cols], blocked along
// its rows; the columnwise copy is the transpose [cols, rows], blocked along ITS rows
// (the original columns). Each copy is quantized from x, never from the other copy.
// "A copy [R, C]" below means either one. Products are rounded to FP32 before the
// saturating round-to-nearest-even FP8 encode of core/float_codec.h (kernels/cast.h
// does the same), FP32 subnormals kept. q.amax is max |x| over the whole tensor (NaN
// if any element is NaN).
//
// Contract (every device):
//   QuantizeMxfp8(x, o)     mode kMxfp8_1D, format E4M3 (default) or E5M2.
//     Blocks of 32 consecutive elements of a copy's row; C % 32 == 0 is required
//     (rowwise: cols, columnwise: rows). Per block, amax_b = max |x| (NaN wins),
//     code = FloatToE8M0RoundUp(amax_b / fp8_max) (FP32 division; fp8_max 448 or
//     57344), data = encode(x * 2^(127 - code)). scale_inv: DType::kFloat8E8M0
//     [R, C / 32], the code itself (decodes as 2^(code - 127)).
//     Edge cases, all following from the formula:
//       zero block      -> code 0x00 (2^-127), data +-0 (the sign of -0 kept)
//       NaN in a block  -> code 0xFF (NaN); x * NaN is NaN, so EVERY element of the
//                          block encodes as the NaN code 0x7F (both formats)
//       Inf in a block  -> code 0xFE (E8M0 saturates); Inf * 2^-127 saturates to
//                          fp8_max, the block's finite elements mostly flush to 0
//       amax_b/fp8_max slightly above 2^k rounds up to 2^(k+1): data cannot overflow.
//   QuantizeBlockScaling(x, o)  mode kBlock1D (o.two_d false) or kBlock2D.
//     1D: blocks of 128 consecutive elements of a copy's row. 2D: 128x128 tiles of x.
//     Partial blocks at the tails are allowed; their scale covers the partial block.
//     Per block, with amax_b as above (FP32 arithmetic):
//       a = amax_b < o.amax_epsilon ? o.amax_epsilon : amax_b
//       scale = 1                  if a == 0 or a is Inf or NaN
//             = fp8_max / a        otherwise (RNE division); Inf becomes FLT_MAX
//       o.power_2_scale: scale's mantissa bits cleared (rounds down to 2^k)
//       data = encode(x * scale), scale_inv = 1 / scale (FP32 RNE)
//     (So with amax_epsilon > 0 a zero block gets fp8_max / amax_epsilon.)
//     scale_inv FP32: 1D rowwise [rows, ceil(cols/128)], columnwise [cols, ceil(rows/128)];
//     2D rowwise [ceil(rows/128), ceil(cols/128)] and the columnwise copy uses the SAME
//     tile scales, transposed: [ceil(cols/128), ceil(rows/128)]. Both 2D copies therefore
//     dequantize to exactly transposed values.
//   DequantizeBlock(q, copy, out_dtype)  [R, C] of the copy: decode(data) * block
//     scale_inv (MXFP8: 2^(code-127) via E8M0ToFloat; code 0xFF gives NaN), one FP32
//     product, stored as FP32 or rounded to BF16 (out_dtype; exactly Convert of the FP32
//     result, in one pass: what an emulated GEMM multiplies on BF16 tensor cores).
//   SwizzleMxfp8Scales(s)   s: E8M0 [M, K/32] (one copy's scale_inv; M = R).
//     Returns E8M0 [roundup(M, 128), roundup(K/32, 4)] whose BYTES are in the tiled
//     order of cuBLASLt's VEC32_UE8M0 scale mode (not row-major): the padded matrix is
//     cut into 128x4 tiles, tile (tr, tc) starts at byte 512 * (tr * padded_cols/4 + tc),
//     and inside it entry (r, c) (r < 128, c < 4) sits at (r % 32) * 16 + (r / 32) * 4 + c.
//     Padding entries are 0x00.
//   UnswizzleMxfp8Scales(t, M, K/32)  the inverse: E8M0 [M, K/32] in row-major order.
//   BlockScalesGemmLayout(s, two_d)  s: one copy's FP32 scale_inv from
//     QuantizeBlockScaling. Returns the layout of cuBLASLt's scale modes on sm_90
//     (row-major shapes; padding entries 0):
//       1D (VEC128_32F):    [ceil(C/128), roundup(R, 4)], out[k][m] = s[m][k]
//                           (transposed, the non-reduced dim R contiguous)
//       2D (BLK128x128_32F): [ceil(R/128), roundup(ceil(C/128), 4)], out[i][j] = s[i][j]
//                           (the reduced-dim block index contiguous)
//     In cuBLAS' column-major terms the operand is K x M with K = C the reduced dim;
//     1D puts scale (k_block, m) at m + k_block * roundup(M, 4) and 2D puts
//     (k_block, m_block) at k_block + m_block * roundup(ceil(K/128), 4). (The layout
//     Transformer Engine's block quantizer emits for cuBLASLt and torch._scaled_mm's
//     blockwise scale strides check.) kernels::Gemm reads block scales in this layout
//     (GemmScaleLayout::kGemm) or converts the quantizer's with it (kQuantizer); the
//     CUDA version allocates its output on ctx.stream.
//   Fused dbias (both ops, o.dbias set): *o.dbias, a defined FP32 [cols] tensor on the
//     Context's device, is overwritten with the column sums of x, exactly as for
//     QuantizePerTensor (kernels/cast.h: FP64 accumulation on the CPU, NaN/Inf
//     propagate, rows == 0 gives zeros); it does not depend on the scales or copies.
//     Wrong dtype/shape/device is INVALID_ARGUMENT naming "options.dbias". The CUDA
//     kernels fuse it: FP32 column sums per slab of rows, summed in FP64 by a second
//     kernel (within the FP32 tolerance of the CPU's, not bit-exact). NVFP4
//     (kernels/nvfp4.h) offers no fused dbias: compute it with a separate column sum.
//
// Errors: INVALID_ARGUMENT naming the argument with expected vs got (dtype, rank,
// device, divisibility, options); CUDA tensors in a build without the CUDA backend give
// FAILED_PRECONDITION. The CPU versions in kernels/cpu are the numerical reference; the
// CUDA kernels (kernels/cuda/block_quantize/block_quantize_cuda.h) match them bit for bit, except the
// payload of a dequantized NaN (any NaN: GPU arithmetic returns its canonical NaN).
#ifndef TESERVE_KERNELS_BLOCK_QUANTIZE_H_
#define TESERVE_KERNELS_BLOCK_QUANTIZE_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "core/context.h"
#include "core/quantized_tensor.h"
#include "core/tensor.h"
#include "kernels/cast.h"

namespace teserve {
namespace kernels {

inline constexpr int64_t kMxfp8BlockSize = 32;
inline constexpr int64_t kFp8BlockScalingSize = 128;
// cuBLASLt's VEC32_UE8M0 tile: 128 rows x 4 scale columns, 512 bytes.
inline constexpr int64_t kMxfp8SwizzleTileRows = 128;
inline constexpr int64_t kMxfp8SwizzleTileCols = 4;
// Padding of the contiguous dimension in the VEC128 / BLK128x128 layouts.
inline constexpr int64_t kBlockScalesGemmAlignment = 4;

struct Mxfp8QuantizeOptions {
  DType format = DType::kFloat8E4M3;
  bool rowwise = true;
  bool columnwise = false;
  // When set: FP32 [cols] column sums of x (FP64 accumulation on the CPU), see above.
  Tensor* dbias = nullptr;
  // CUDA: leave the amax on the device (QuantizedTensor::amax_bits) instead of waiting for
  // the stream to read it, as PerTensorQuantizeOptions::defer_amax. The CPU computes it
  // in place either way.
  bool defer_amax = false;
};

struct BlockScalingQuantizeOptions {
  DType format = DType::kFloat8E4M3;
  bool rowwise = true;
  bool columnwise = false;
  bool two_d = false;         // 128x128 tiles (weights) instead of 1x128 blocks
  bool power_2_scale = true;  // round each scale down to a power of two
  float amax_epsilon = 0.0f;  // floor on the block amax; finite and >= 0
  // When set: FP32 [cols] column sums of x (FP64 accumulation on the CPU), see above.
  Tensor* dbias = nullptr;
  bool defer_amax = false;  // as Mxfp8QuantizeOptions::defer_amax
};

absl::StatusOr<QuantizedTensor> QuantizeMxfp8(const Context& ctx, const Tensor& x,
                                              const Mxfp8QuantizeOptions& options);

absl::StatusOr<QuantizedTensor> QuantizeBlockScaling(const Context& ctx, const Tensor& x,
                                                     const BlockScalingQuantizeOptions& options);

// q.mode must be kMxfp8_1D, kBlock1D or kBlock2D.
absl::StatusOr<Tensor> DequantizeBlock(const Context& ctx, const QuantizedTensor& q, Copy copy,
                                       DType out_dtype = DType::kFloat32);

absl::StatusOr<Tensor> SwizzleMxfp8Scales(const Context& ctx, const Tensor& scales);

absl::StatusOr<Tensor> UnswizzleMxfp8Scales(const Context& ctx, const Tensor& swizzled,
                                            int64_t rows, int64_t cols);

absl::StatusOr<Tensor> BlockScalesGemmLayout(const Context& ctx, const Tensor& scale_inv,
                                             bool two_d);

}  // namespace kernels
}  // namespace teserve

#endif  // TESERVE_KERNELS_BLOCK_QUANTIZE_H_
