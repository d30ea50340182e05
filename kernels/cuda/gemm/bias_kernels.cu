#include "kernels/cuda/gemm/bias_kernels.h"

namespace teserve {
namespace kernels {
namespace cuda {
namespace {

constexpr int kAddBiasThreads = 256;
constexpr int kColumnTile = 32;   // columns per block: one warp-wide row segment
constexpr int kRowWarps = 8;      // warps per block, striding over rows

__global__ void __launch_bounds__(kAddBiasThreads)
    AddBiasKernel(const float* __restrict__ bias, int64_t rows, int64_t cols, float* __restrict__ y) {
  const int64_t total = rows * cols;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    y[i] += bias[i % cols];
  }
}

// Block (column tile, row chunk): partials[chunk, col] = the chunk's column sum.
__global__ void __launch_bounds__(kColumnTile* kRowWarps)
    ColumnSumChunkKernel(const float* __restrict__ x, int64_t rows, int64_t cols, double* __restrict__ partials) {
  __shared__ double partial[kRowWarps][kColumnTile];
  const int lane = threadIdx.x;
  const int warp = threadIdx.y;
  const int64_t col = blockIdx.x * static_cast<int64_t>(kColumnTile) + lane;
  const int64_t begin = blockIdx.y * kColumnSumChunkRows;
  const int64_t end = begin + kColumnSumChunkRows < rows ? begin + kColumnSumChunkRows : rows;
  double sum = 0.0;
  if (col < cols) {
    for (int64_t r = begin + warp; r < end; r += kRowWarps) sum += x[r * cols + col];
  }
  partial[warp][lane] = sum;
  __syncthreads();
  if (warp != 0 || col >= cols) return;
  double total = 0.0;
  for (int w = 0; w < kRowWarps; ++w) total += partial[w][lane];
  partials[blockIdx.y * cols + col] = total;
}

// out[col] (+)= sum over chunks of partials[chunk, col], in chunk order.
__global__ void __launch_bounds__(kAddBiasThreads)
    ColumnSumFinishKernel(const double* __restrict__ partials, int64_t chunks, int64_t cols, bool accumulate,
                          float* __restrict__ out) {
  const int64_t col = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (col >= cols) return;
  double total = 0.0;
  for (int64_t c = 0; c < chunks; ++c) total += partials[c * cols + col];
  out[col] = accumulate ? static_cast<float>(out[col] + total) : static_cast<float>(total);
}

}  // namespace

cudaError_t LaunchAddBias(const float* bias, int64_t rows, int64_t cols, float* y, cudaStream_t stream) {
  const int64_t total = rows * cols;
  if (total == 0) return cudaSuccess;
  const int64_t blocks = (total + kAddBiasThreads - 1) / kAddBiasThreads;
  const int grid = static_cast<int>(blocks < 65536 ? blocks : 65536);
  AddBiasKernel<<<grid, kAddBiasThreads, 0, stream>>>(bias, rows, cols, y);
  return cudaGetLastError();
}

int64_t ColumnSumScratch(int64_t rows, int64_t cols) {
  const int64_t chunks = rows > 0 ? (rows + kColumnSumChunkRows - 1) / kColumnSumChunkRows : 1;
  return chunks * cols;
}

cudaError_t LaunchColumnSum(const float* x, int64_t rows, int64_t cols, bool accumulate, double* partials,
                            float* out, cudaStream_t stream) {
  if (cols == 0) return cudaSuccess;
  const int64_t chunks = rows > 0 ? (rows + kColumnSumChunkRows - 1) / kColumnSumChunkRows : 1;
  const dim3 block(kColumnTile, kRowWarps);
  const dim3 grid(static_cast<unsigned>((cols + kColumnTile - 1) / kColumnTile), static_cast<unsigned>(chunks));
  ColumnSumChunkKernel<<<grid, block, 0, stream>>>(x, rows, cols, partials);
  const cudaError_t status = cudaGetLastError();
  if (status != cudaSuccess) return status;
  const unsigned finish_grid = static_cast<unsigned>((cols + kAddBiasThreads - 1) / kAddBiasThreads);
  ColumnSumFinishKernel<<<finish_grid, kAddBiasThreads, 0, stream>>>(partials, chunks, cols, accumulate, out);
  return cudaGetLastError();
}

}  // namespace cuda
}  // namespace kernels
}  // namespace teserve
