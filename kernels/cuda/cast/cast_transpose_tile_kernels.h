// The 128 x 128 register-tile FP8 cast-transpose (cast_transpose_tile_kernels.cu), one
// of the kernels behind LaunchQuantizePerTensor (cast_kernels.h). Light header: CUDA
// runtime types only; cast_kernels.cu is its caller.
#ifndef TESERVE_KERNELS_CUDA_CAST_TRANSPOSE_TILE_KERNELS_H_
#define TESERVE_KERNELS_CUDA_CAST_TRANSPOSE_TILE_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/cast/cast_kernels.h"

namespace teserve {
namespace kernels {
namespace cuda {

// Rows of x per tile, so per dbias partial row.
inline constexpr int64_t kCastTransposeTileRows = 128;

// True when the tile kernel takes these params: p.kernel is kAuto, rows and cols are
// multiples of 8, x is 16-byte and the requested outputs 8-byte aligned.
bool CastTransposeTileApplies(const QuantizeLaunchParams& p);

// One launch over the tiles (p.amax_bits already zeroed, rows and cols > 0): amax,
// rowwise and columnwise codes, scale_inv values, and with p.dbias set the FP32 column
// sums of each tile's rows in p.dbias_workspace [ceil(rows / 128), cols] (the caller
// reduces them into p.dbias).
cudaError_t LaunchCastTransposeTile(const QuantizeLaunchParams& p, cudaStream_t stream);

}  // namespace cuda
}  // namespace kernels
}  // namespace teserve

#endif  // TESERVE_KERNELS_CUDA_CAST_TRANSPOSE_TILE_KERNELS_H_
