// NVFP4 block scaling (NVFP4BlockScaling): FP4 E2M1 data, E4M3 scales per 16-element
// block (1D) or per 16x16 block (2D, weights), one FP32 per-tensor encode scale.
//
// Contract (every device). x is FP32 [rows, cols]. The rowwise copy has x's layout; the
// columnwise copy is the transpose [cols, rows]; blocks always run along the last dim
// of the copy, and each copy is quantized from the FP32 source (never from the other).
//
// Per-tensor scale (QuantizedTensor::global_encode_scale):
//   amax     = max |x| over the whole tensor; NaN if any element is NaN; -0 counts 0.
//   S        = 2688.0f / scaling_amax (2688 = 448 * 6, FP32 division); S = FLT_MAX
//              when that overflows (tiny amax); S = 1 when scaling_amax is 0, Inf or NaN.
//   scaling_amax is amax, except with random_hadamard and a columnwise copy, where it is
//   max(amax, max |RHT(x^T)|) so that neither copy clips (the 16-point transform can grow
//   a magnitude up to 4x). q.amax always reports amax of x itself.
//   inv_S    = 1.0f / S.
// Per block (16 elements, or 16x16 in 2D), all in FP32, in this order:
//   block_amax = max |x| over the block, NaN if the block holds a NaN.
//   byte       = FloatToE4M3((block_amax / 6.0f) * S)  (RNE, satfinite; NaN -> 0x7F)
//   sd         = E4M3ToFloat(byte)                      (the stored decode scale)
//   e          = sd > 0 ? min(1.0f / (sd * inv_S), FLT_MAX) : 0  (0 for zero and NaN
//                blocks; the clamp keeps 0 * e finite when inv_S is tiny)
//   y          = x * e (one FP32 multiply)
//   code       = FloatToE2M1(y) (RNE, satfinite; -0 -> 0x8; NaN -> 0x7), or with
//                stochastic_rounding StochasticRoundToE2M1(y, draw) from
//                kernels/stochastic_rounding.h, the draw keyed by (ctx.seed,
//                options.rng_stream, copy id, linear index of the element in the copy
//                being written); copy id 0 rowwise, 1 columnwise.
// Dequantize: out = (E2M1ToFloat(code) * sd) * inv_S, in the copy's layout.
//
// Non-finite inputs (policy): a NaN makes amax NaN (the caller sees it) and S = 1; its
//   block gets scale byte 0x7F, so the whole block dequantizes to NaN (a NaN is never
//   laundered into a number); the codes in that block are FloatToE2M1(x * 0). An Inf
//   makes amax Inf and S = 1; its block scale saturates to 448 and the Inf to +-6, so it
//   dequantizes to +-2688 like the satfinite FP8 casts.
//
// Layouts (DType::kFloat4E2M1 packs two per byte, element 2i in the low nibble;
// scales are DType::kFloat8E4M3 bytes):
//   1D (ScalingMode::kNvfp4_1D): rowwise data [rows, cols], scale_inv [rows, cols/16];
//      columnwise data [cols, rows], scale_inv [cols, rows/16].
//   2D (ScalingMode::kNvfp4_2D): one scale per 16x16 block of x: rowwise scale_inv
//      [rows/16, cols/16], columnwise scale_inv its transpose [cols/16, rows/16]. Both
//      copies use the same e per block, so columnwise data is exactly the transpose of
//      rowwise data and both dequantize identically. With stochastic rounding, 2D draws
//      once per source element (copy id 0, rowwise linear index) for both copies.
//      Expanding scales to what a GEMM library wants (per row, swizzled) is the GEMM's job.
// Divisibility: the blocked dimension must be a multiple of 16: cols for a rowwise copy,
//   rows for a columnwise copy, both in 2D (INVALID_ARGUMENT naming x.shape[i]).
// Random Hadamard transform (options.random_hadamard, 1D only): the columnwise source is
//   ApplyHadamard16(x^T) (kernels/hadamard.h), i.e. transformed along rows (the token
//   dimension of an activation or gradient), before the scale computation above. The
//   rowwise copy is never transformed. Dequantize returns the transformed domain; apply
//   ApplyInverseHadamard16 to recover x^T. QuantizedTensor does not record the flag: the
//   caller (the recipe) knows it and must transform both wgrad operands alike.
//
// The CPU versions (kernels/cpu/nvfp4_cpu.h) are the reference; the CUDA kernels
// (kernels/cuda/nvfp4/nvfp4_cuda.h) match them bit for bit (FP32 arithmetic without fused
// multiply-add or fast-math reciprocals, the same counter-based draws), except the
// payload of a dequantized NaN. CUDA tensors in a build without the CUDA backend get
// FAILED_PRECONDITION.
#ifndef TESERVE_KERNELS_NVFP4_H_
#define TESERVE_KERNELS_NVFP4_H_

#include <cfloat>
#include <cstdint>

#include "absl/status/statusor.h"
#include "core/context.h"
#include "core/quantized_tensor.h"
#include "core/tensor.h"
#include "kernels/cast.h"

namespace teserve {
namespace kernels {

inline constexpr int kNvfp4BlockSize = 16;

struct Nvfp4QuantizeOptions {
  bool rowwise = true;
  bool columnwise = false;
  bool two_d = false;                // 16x16 blocks (weights)
  bool random_hadamard = false;      // RHT on the columnwise copy; not with two_d
  bool stochastic_rounding = false;  // for gradients
  uint64_t rng_stream = 0;           // with ctx.seed, keys the stochastic draws
};

// The S rule above, exposed so recipes and tests share it.
inline float Nvfp4GlobalEncodeScale(float scaling_amax) {
  // `!(a <= FLT_MAX)` is true for NaN and Inf.
  if (scaling_amax == 0.0f || !(scaling_amax <= FLT_MAX)) return 1.0f;
  const float s = 2688.0f / scaling_amax;
  return s <= FLT_MAX ? s : FLT_MAX;
}

absl::StatusOr<QuantizedTensor> QuantizeNvfp4(const Context& ctx, const Tensor& x,
                                              const Nvfp4QuantizeOptions& options);

// Values of the requested copy, in that copy's layout: FP32, or rounded to BF16
// (out_dtype; exactly Convert of the FP32 values, in one pass).
absl::StatusOr<Tensor> DequantizeNvfp4(const Context& ctx, const QuantizedTensor& q, Copy copy,
                                       DType out_dtype = DType::kFloat32);

// Unscaled conversions for packed FP4 of any shape and element count (an odd count
// leaves the last high nibble 0): FloatToE2M1 per element, and E2M1ToFloat back.
absl::StatusOr<Tensor> CastToFloat4E2M1(const Context& ctx, const Tensor& x);
absl::StatusOr<Tensor> Float4E2M1ToFloat32(const Context& ctx, const Tensor& packed);

}  // namespace kernels
}  // namespace teserve

#endif  // TESERVE_KERNELS_NVFP4_H_
