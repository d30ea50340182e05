// The 16-point random Hadamard transform (RHT) NVFP4 applies to the wgrad operands.
//
// Contract (every device):
//   H         16x16 Sylvester Hadamard matrix, H[i][j] = (-1)^popcount(i & j).
//   d         fixed random signs, kHadamardSigns below (fixed forever: changing them
//             changes every RHT-quantized tensor teserve ever produced).
//   M         = H * diag(d) / 4, orthogonal (H H^T = 16 I), so M^-1 = M^T.
//   ApplyHadamard16(x)         x FP32 [rows, cols], cols % 16 == 0. Every run of 16
//                              consecutive elements of a row (a tile) v becomes M v.
//   ApplyInverseHadamard16(y)  the same tiles, v = M^T y. Inverse up to FP32 rounding.
// NVFP4 transforms both wgrad operands along the token dimension N (dy columnwise
// [out, N] and x columnwise [in, N]); the block-diagonal transform B is orthogonal, so
// (dy^T B^T)(B x) = dy^T x in exact arithmetic while the outliers of each 16-token tile
// are spread over the tile before quantization.
//
// FP32 operation order, so a CUDA-core kernel can reproduce the CPU bit for bit:
//   forward: w[j] = d[j] * v[j] (exact); four butterfly stages h = 1, 2, 4, 8, each
//            replacing (w[i], w[i + h]) by (w[i] + w[i + h], w[i] - w[i + h]) for every
//            i with (i & h) == 0; then out[i] = w[i] * 0.25f.
//   inverse: w = y; the same four stages; out[j] = d[j] * (w[j] * 0.25f).
// A tensor-core (MMA) implementation sums in another order and is compared with a
// tolerance instead; the quantization after it is still bit-exact given its output.
//
// Derivation of d (documented so it can be checked, never re-derived differently):
//   d[j] = -1 if bit 63 of Mix64(kHadamardSignSeed + j) is set, else +1, with Mix64
//   from kernels/stochastic_rounding.h.
#ifndef TESERVE_KERNELS_HADAMARD_H_
#define TESERVE_KERNELS_HADAMARD_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "core/context.h"
#include "core/tensor.h"

namespace teserve {
namespace kernels {

inline constexpr int kHadamardSize = 16;
inline constexpr uint64_t kHadamardSignSeed = 0x5445534552564531ull;  // "TESERVE1"
inline constexpr float kHadamardSigns[kHadamardSize] = {1, 1, -1, 1, 1, -1, 1, 1,
                                                        1, -1, 1, -1, 1, 1, 1, -1};

absl::StatusOr<Tensor> ApplyHadamard16(const Context& ctx, const Tensor& x);
absl::StatusOr<Tensor> ApplyInverseHadamard16(const Context& ctx, const Tensor& y);

}  // namespace kernels
}  // namespace teserve

#endif  // TESERVE_KERNELS_HADAMARD_H_
