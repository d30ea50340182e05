// Internal to the block_quantize_kernels library: the register-tiled MXFP8 kernel of
// block_quantize_tile_kernels.cu, which LaunchBlockQuantize (block_quantize_kernels.cu)
// picks when it applies, and the dbias column-sum reduction both kernel files share.
// Contract and formulas: kernels/block_quantize.h; parameters: block_quantize_kernels.h.
#ifndef TESERVE_KERNELS_CUDA_BLOCK_QUANTIZE_TILE_KERNELS_H_
#define TESERVE_KERNELS_CUDA_BLOCK_QUANTIZE_TILE_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/block_quantize/block_quantize_kernels.h"

namespace teserve {
namespace kernels {
namespace cuda {

// Whether LaunchMxfp8TileQuantize handles p: MXFP8, hardware encoder, rows and cols
// multiples of 32, x 16-byte and the copies 8-byte aligned.
bool Mxfp8TileKernelApplies(const BlockQuantizeLaunchParams& p);

// Rows of x summed into one dbias partial row by LaunchMxfp8TileQuantize.
inline constexpr int64_t kMxfp8TileRows = 128;

// One pass over x (p.amax_bits already zeroed, rows and cols > 0). With p.dbias set,
// writes p.dbias_workspace [ceil(rows / 128), cols] (column sums of each 128-row slab)
// and reduces it into p.dbias. One 128-row tile per CTA; for measurements and tests,
// TESERVE_MXFP8_TILES_DOWN=2, 4 or 8 (environment, read once) makes each CTA of a BF16
// launch without dbias quantize that many tiles down (same results, slower on the H200).
cudaError_t LaunchMxfp8TileQuantize(const BlockQuantizeLaunchParams& p, cudaStream_t stream);

// dbias[c] = sum over s < slabs of partial[s * cols + c], accumulated in FP64 in slab
// order and rounded once to FP32.
cudaError_t LaunchDbiasReduce(const float* partial, int64_t slabs, int64_t cols, float* dbias,
                              cudaStream_t stream);

}  // namespace cuda
}  // namespace kernels
}  // namespace teserve

#endif  // TESERVE_KERNELS_CUDA_BLOCK_QUANTIZE_TILE_KERNELS_H_
