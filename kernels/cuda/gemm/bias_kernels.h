// Launchers of Linear's bias helpers on FP32 row-major matrices (contract
// kernels/gemm.h): AddBias y[i, j] += bias[j]; ColumnSum out[j] (+)= sum_i x[i, j].
// Light header (CUDA runtime only); the launchers do not synchronize and return
// cudaGetLastError after the launch.
//
// ColumnSum is deterministic and accumulates in double, as the CPU reference does: a
// block owns 32 adjacent columns (one warp reads 128 contiguous bytes of a row) and one
// chunk of kColumnSumChunkRows rows, its 8 warps stride over the chunk, and the 8
// partial sums are added in a fixed order into partials[chunk, column] (double); a
// second launch adds the chunks of each column in chunk order. Chunking the rows gives
// a tall matrix (16384 tokens) enough blocks to stream at full bandwidth. It is a bias
// gradient, reduced over batch x sequence rows, where FP32 sums drift.
#ifndef TESERVE_KERNELS_CUDA_GEMM_BIAS_KERNELS_H_
#define TESERVE_KERNELS_CUDA_GEMM_BIAS_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace teserve {
namespace kernels {
namespace cuda {

cudaError_t LaunchAddBias(const float* bias, int64_t rows, int64_t cols, float* y, cudaStream_t stream);

inline constexpr int64_t kColumnSumChunkRows = 256;

// Doubles the column sum of `rows` rows needs as scratch: ceil(rows / chunk) * cols.
int64_t ColumnSumScratch(int64_t rows, int64_t cols);

// partials: ColumnSumScratch(rows, cols) doubles on the device (stream-ordered).
cudaError_t LaunchColumnSum(const float* x, int64_t rows, int64_t cols, bool accumulate, double* partials,
                            float* out, cudaStream_t stream);

}  // namespace cuda
}  // namespace kernels
}  // namespace teserve

#endif  // TESERVE_KERNELS_CUDA_GEMM_BIAS_KERNELS_H_
