// Reductions over a warp and over a block, for the row-per-block kernels (cross entropy,
// softmax) and the deterministic double sums (sum of squares, MSE). Only .cu files include this. Like device_common.cuh, everything sits
// in an unnamed namespace, so each kernel file keeps its own internal copy.
#ifndef TESERVE_KERNELS_CUDA_BLOCK_REDUCE_CUH_
#define TESERVE_KERNELS_CUDA_BLOCK_REDUCE_CUH_

#include <cuda_runtime.h>

namespace teserve {
namespace kernels {
namespace cuda {
namespace {

__device__ __forceinline__ float WarpMax(float x) {
  for (int o = 16; o > 0; o /= 2) x = fmaxf(x, __shfl_xor_sync(0xFFFFFFFFu, x, o));
  return x;
}

__device__ __forceinline__ float WarpSum(float x) {
  for (int o = 16; o > 0; o /= 2) x += __shfl_xor_sync(0xFFFFFFFFu, x, o);
  return x;
}

// Block-wide reductions of kBlockThreads threads; every thread gets the result. `shared`
// holds kBlockThreads / 32 floats. The leading __syncthreads keeps a previous reduction's
// readers ahead of the writes.
template <int kBlockThreads>
__device__ float BlockMaxOf(float x, float* shared) {
  x = WarpMax(x);
  __syncthreads();
  if (threadIdx.x % 32 == 0) shared[threadIdx.x / 32] = x;
  __syncthreads();
  float r = shared[0];
  for (int w = 1; w < kBlockThreads / 32; ++w) r = fmaxf(r, shared[w]);
  return r;
}

template <int kBlockThreads>
__device__ float BlockSumOf(float x, float* shared) {
  x = WarpSum(x);
  __syncthreads();
  if (threadIdx.x % 32 == 0) shared[threadIdx.x / 32] = x;
  __syncthreads();
  float r = 0.0f;
  for (int w = 0; w < kBlockThreads / 32; ++w) r += shared[w];
  return r;
}

// The block-wide sum of doubles by a tree in shared memory (kBlockThreads a power of two;
// `shared` holds kBlockThreads doubles): a fixed order, so the same bits every run; every
// thread gets the result.
template <int kBlockThreads>
__device__ double BlockTreeSum(double x, double* shared) {
  shared[threadIdx.x] = x;
  __syncthreads();
  for (int stride = kBlockThreads / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) shared[threadIdx.x] += shared[threadIdx.x + stride];
    __syncthreads();
  }
  return shared[0];
}

}  // namespace
}  // namespace cuda
}  // namespace kernels
}  // namespace teserve

#endif  // TESERVE_KERNELS_CUDA_BLOCK_REDUCE_CUH_
