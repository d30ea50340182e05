// Scaled softmax, one block per row of sk scores. Forward: a max pass over the unmasked
// scaled scores, a pass summing exp(s - max), a pass writing the normalized values (zeros
// for masked keys and fully masked rows). Backward: a pass summing dy * y, a pass writing
// scale * y * (dy - sum). Block reductions through warp shuffles and shared memory.
#include "kernels/cuda/softmax/softmax_kernels.h"

#include <cmath>

#include "kernels/cuda/block_reduce.cuh"

namespace teserve {
namespace kernels {
namespace cuda {
namespace {

constexpr int kThreads = 128;
constexpr int64_t kMaxBlocks = 65535;

__device__ __forceinline__ bool Masked(const SoftmaxLaunchParams& p, const uint8_t* mask_row, int64_t i,
                                       int64_t j) {
  switch (p.kind) {
    case SoftmaxMaskKind::kPadding:
      return mask_row[j] != 0;
    case SoftmaxMaskKind::kCausalTopLeft:
      return j > i;
    case SoftmaxMaskKind::kCausalBottomRight:
      return j > i + p.sk - p.sq;
    default:
      return false;
  }
}

__global__ void __launch_bounds__(kThreads) ScaledSoftmaxForwardKernel(SoftmaxLaunchParams p, const float* x,
                                                                       float* y) {
  __shared__ float shared[kThreads / 32];
  const int64_t rows = p.batches * p.heads * p.sq;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t i = r % p.sq;
    const int64_t b = r / (p.heads * p.sq);
    const float* xr = x + r * p.sk;
    float* yr = y + r * p.sk;
    const uint8_t* mr = p.mask == nullptr ? nullptr : p.mask + (b * p.sq + i) * p.sk;
    float max = -INFINITY;
    for (int64_t j = threadIdx.x; j < p.sk; j += kThreads) {
      if (!Masked(p, mr, i, j)) max = fmaxf(max, p.scale * xr[j]);
    }
    max = BlockMaxOf<kThreads>(max, shared);
    if (max == -INFINITY) {  // fully masked row (uniform across the block)
      for (int64_t j = threadIdx.x; j < p.sk; j += kThreads) yr[j] = 0.0f;
      continue;
    }
    float sum = 0.0f;
    for (int64_t j = threadIdx.x; j < p.sk; j += kThreads) {
      if (!Masked(p, mr, i, j)) sum += expf(p.scale * xr[j] - max);
    }
    const float inv = 1.0f / BlockSumOf<kThreads>(sum, shared);
    for (int64_t j = threadIdx.x; j < p.sk; j += kThreads) {
      yr[j] = Masked(p, mr, i, j) ? 0.0f : expf(p.scale * xr[j] - max) * inv;
    }
  }
}

__global__ void __launch_bounds__(kThreads) ScaledSoftmaxBackwardKernel(SoftmaxLaunchParams p, const float* y,
                                                                        const float* dy, float* dx) {
  __shared__ float shared[kThreads / 32];
  const int64_t rows = p.batches * p.heads * p.sq;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* yr = y + r * p.sk;
    const float* gr = dy + r * p.sk;
    float* out = dx + r * p.sk;
    float dot = 0.0f;
    for (int64_t j = threadIdx.x; j < p.sk; j += kThreads) dot += gr[j] * yr[j];
    dot = BlockSumOf<kThreads>(dot, shared);
    for (int64_t j = threadIdx.x; j < p.sk; j += kThreads) out[j] = p.scale * yr[j] * (gr[j] - dot);
  }
}

unsigned GridFor(const SoftmaxLaunchParams& p) {
  const int64_t rows = p.batches * p.heads * p.sq;
  return static_cast<unsigned>(rows < kMaxBlocks ? rows : kMaxBlocks);
}

}  // namespace

cudaError_t LaunchScaledSoftmaxForward(const SoftmaxLaunchParams& params, const float* x, float* y,
                                       cudaStream_t stream) {
  if (params.batches * params.heads * params.sq <= 0 || params.sk <= 0) return cudaSuccess;
  ScaledSoftmaxForwardKernel<<<GridFor(params), kThreads, 0, stream>>>(params, x, y);
  return cudaGetLastError();
}

cudaError_t LaunchScaledSoftmaxBackward(const SoftmaxLaunchParams& params, const float* y, const float* dy,
                                        float* dx, cudaStream_t stream) {
  if (params.batches * params.heads * params.sq <= 0 || params.sk <= 0) return cudaSuccess;
  ScaledSoftmaxBackwardKernel<<<GridFor(params), kThreads, 0, stream>>>(params, y, dy, dx);
  return cudaGetLastError();
}

}  // namespace cuda
}  // namespace kernels
}  // namespace teserve
