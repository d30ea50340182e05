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

__global__ void __launch_bounds__(kColumnTile* kRowWarps)
    ColumnSumKernel(const float* __restrict__ x, int64_t rows, int64_t cols, bool accumulate,
                    float* __restrict__ out) {
  __shared__ double partial[kRowWarps][kColumnTile];
  const int lane = threadIdx.x;
  const int warp = threadIdx.y;
  const int64_t col = blockIdx.x * static_cast<int64_t>(kColumnTile) + lane;
  double sum = 0.0;
  if (col < cols) {
    for (int64_t r = warp; r < rows; r += kRowWarps) sum += x[r * cols + col];
  }
  partial[warp][lane] = sum;
  __syncthreads();
  if (warp != 0 || col >= cols) return;
  double total = 0.0;
  for (int w = 0; w < kRowWarps; ++w) total += partial[w][lane];
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

cudaError_t LaunchColumnSum(const float* x, int64_t rows, int64_t cols, bool accumulate, float* out,
                            cudaStream_t stream) {
  if (cols == 0) return cudaSuccess;
  const dim3 block(kColumnTile, kRowWarps);
  const int64_t grid = (cols + kColumnTile - 1) / kColumnTile;
  ColumnSumKernel<<<static_cast<unsigned>(grid), block, 0, stream>>>(x, rows, cols, accumulate, out);
  return cudaGetLastError();
}

}  // namespace cuda
}  // namespace kernels
}  // namespace teserve
