#include "kernels/cuda/elementwise/elementwise_kernels.h"

namespace teserve {
namespace kernels {
namespace cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxGrid = 4096;

int GridFor(int64_t n) {
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<int>(blocks < kMaxGrid ? blocks : kMaxGrid);
}

__global__ void __launch_bounds__(kThreads) AddIntoKernel(const float* __restrict__ x, int64_t n, float* into) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * kThreads) {
    into[i] += x[i];
  }
}

__global__ void __launch_bounds__(kThreads) ScaleKernel(float factor, int64_t n, float* x) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * kThreads) {
    x[i] *= factor;
  }
}

__device__ double BlockSum(double value) {
  __shared__ double shared[kThreads];
  shared[threadIdx.x] = value;
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) shared[threadIdx.x] += shared[threadIdx.x + stride];
    __syncthreads();
  }
  return shared[0];
}

__global__ void __launch_bounds__(kThreads)
    SumOfSquaresKernel(const float* __restrict__ x, int64_t n, double* partials) {
  double sum = 0.0;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * kThreads) {
    const double v = x[i];
    sum += v * v;
  }
  const double total = BlockSum(sum);
  if (threadIdx.x == 0) partials[blockIdx.x] = total;
}

__global__ void SumPartialsKernel(const double* __restrict__ partials, int64_t count, double* sum) {
  if (threadIdx.x != 0) return;
  double total = 0.0;
  for (int64_t i = 0; i < count; ++i) total += partials[i];
  *sum = total;
}

}  // namespace

cudaError_t LaunchAddInto(const float* x, int64_t n, float* into, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  AddIntoKernel<<<GridFor(n), kThreads, 0, stream>>>(x, n, into);
  return cudaGetLastError();
}

cudaError_t LaunchScale(float factor, int64_t n, float* x, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  ScaleKernel<<<GridFor(n), kThreads, 0, stream>>>(factor, n, x);
  return cudaGetLastError();
}

cudaError_t LaunchSumOfSquaresPartials(const float* x, int64_t n, double* partials, cudaStream_t stream) {
  SumOfSquaresKernel<<<kSumOfSquaresBlocks, kThreads, 0, stream>>>(x, n, partials);
  return cudaGetLastError();
}

cudaError_t LaunchSumPartials(const double* partials, int64_t count, double* sum, cudaStream_t stream) {
  SumPartialsKernel<<<1, 32, 0, stream>>>(partials, count, sum);
  return cudaGetLastError();
}

}  // namespace cuda
}  // namespace kernels
}  // namespace teserve
