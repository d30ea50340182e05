// Cross entropy, one block per token row. Forward: a max pass, then one pass summing
// exp(x - max) and x (FP32, block reductions through warp shuffles and shared memory).
// Rows read as float4 when V is a multiple of 4 (every row then 16-byte aligned).
// Backward: one pass writing softmax - target, scaled.
#include "kernels/cuda/loss/loss_kernels.h"

#include <cmath>

#include "kernels/cuda/block_reduce.cuh"

namespace teserve {
namespace kernels {
namespace cuda {
namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads) CrossEntropyForwardKernel(CrossEntropyLaunchParams p, float* lse_out,
                                                                      float* loss_out) {
  __shared__ float shared[kThreads / 32];
  const int64_t r = blockIdx.x;
  const float* x = p.logits + r * p.v;
  const bool vec = p.v % 4 == 0;
  float max = -INFINITY;
  if (vec) {
    for (int64_t j = 4 * threadIdx.x; j < p.v; j += 4 * kThreads) {
      const float4 a = __ldg(reinterpret_cast<const float4*>(x + j));
      max = fmaxf(max, fmaxf(fmaxf(a.x, a.y), fmaxf(a.z, a.w)));
    }
  } else {
    for (int64_t j = threadIdx.x; j < p.v; j += kThreads) max = fmaxf(max, x[j]);
  }
  max = BlockMaxOf<kThreads>(max, shared);
  float sum_exp = 0.0f, sum_x = 0.0f;
  if (vec) {
    for (int64_t j = 4 * threadIdx.x; j < p.v; j += 4 * kThreads) {
      const float4 a = __ldg(reinterpret_cast<const float4*>(x + j));
      sum_exp += expf(a.x - max) + expf(a.y - max) + expf(a.z - max) + expf(a.w - max);
      sum_x += (a.x + a.y) + (a.z + a.w);
    }
  } else {
    for (int64_t j = threadIdx.x; j < p.v; j += kThreads) {
      sum_exp += expf(x[j] - max);
      sum_x += x[j];
    }
  }
  sum_exp = BlockSumOf<kThreads>(sum_exp, shared);
  sum_x = BlockSumOf<kThreads>(sum_x, shared);
  if (threadIdx.x != 0) return;
  const float lse = max + logf(sum_exp);
  lse_out[r] = lse;
  const int64_t label = p.labels[r];
  if (label == p.ignore_index) {
    loss_out[r] = 0.0f;
    return;
  }
  const float s = p.label_smoothing;
  loss_out[r] = (1.0f - s) * (lse - x[label]) + s * (lse - sum_x / static_cast<float>(p.v));
}

__global__ void __launch_bounds__(kThreads) CrossEntropyBackwardKernel(CrossEntropyLaunchParams p, const float* lse,
                                                                       float scale, float* dx) {
  const int64_t r = blockIdx.x;
  const float* x = p.logits + r * p.v;
  float* g = dx + r * p.v;
  const int64_t label = p.labels[r];
  if (label == p.ignore_index) {
    for (int64_t j = threadIdx.x; j < p.v; j += kThreads) g[j] = 0.0f;
    return;
  }
  const float row_lse = lse[r];
  const float uniform = p.label_smoothing / static_cast<float>(p.v);
  const float hit = 1.0f - p.label_smoothing;
  auto grad = [&](int64_t j, float xj) {
    const float target = j == label ? uniform + hit : uniform;
    return scale * (expf(xj - row_lse) - target);
  };
  if (p.v % 4 == 0) {
    for (int64_t j = 4 * threadIdx.x; j < p.v; j += 4 * kThreads) {
      const float4 a = __ldg(reinterpret_cast<const float4*>(x + j));
      *reinterpret_cast<float4*>(g + j) =
          make_float4(grad(j, a.x), grad(j + 1, a.y), grad(j + 2, a.z), grad(j + 3, a.w));
    }
  } else {
    for (int64_t j = threadIdx.x; j < p.v; j += kThreads) g[j] = grad(j, x[j]);
  }
}

}  // namespace

cudaError_t LaunchCrossEntropyForward(const CrossEntropyLaunchParams& params, float* lse, float* per_token_loss,
                                      cudaStream_t stream) {
  if (params.n <= 0) return cudaSuccess;
  CrossEntropyForwardKernel<<<static_cast<unsigned>(params.n), kThreads, 0, stream>>>(params, lse, per_token_loss);
  return cudaGetLastError();
}

cudaError_t LaunchCrossEntropyBackward(const CrossEntropyLaunchParams& params, const float* lse, float scale,
                                       float* dx, cudaStream_t stream) {
  if (params.n <= 0) return cudaSuccess;
  CrossEntropyBackwardKernel<<<static_cast<unsigned>(params.n), kThreads, 0, stream>>>(params, lse, scale, dx);
  return cudaGetLastError();
}

namespace {

constexpr int kMseThreads = 256;

__global__ void __launch_bounds__(kMseThreads)
    MsePartialsKernel(const float* __restrict__ y, const float* __restrict__ t, int64_t n, double* partials) {
  double sum = 0.0;
  for (int64_t k = blockIdx.x * static_cast<int64_t>(kMseThreads) + threadIdx.x; k < n;
       k += static_cast<int64_t>(gridDim.x) * kMseThreads) {
    const double d = static_cast<double>(y[k]) - t[k];
    sum += d * d;
  }
  __shared__ double shared[kMseThreads];
  const double total = BlockTreeSum<kMseThreads>(sum, shared);
  if (threadIdx.x == 0) partials[blockIdx.x] = total;
}

__global__ void MseFinishKernel(const double* partials, int count, int64_t n, float* loss) {
  double sum = 0.0;
  for (int b = 0; b < count; ++b) sum += partials[b];
  *loss = n == 0 ? 0.0f : static_cast<float>(sum / static_cast<double>(n));
}

__global__ void __launch_bounds__(kMseThreads)
    MseBackwardKernel(const float* __restrict__ y, const float* __restrict__ t, int64_t n, double scale,
                      float* __restrict__ dy) {
  for (int64_t k = blockIdx.x * static_cast<int64_t>(kMseThreads) + threadIdx.x; k < n;
       k += static_cast<int64_t>(gridDim.x) * kMseThreads) {
    dy[k] = static_cast<float>(scale * (static_cast<double>(y[k]) - t[k]));
  }
}

}  // namespace

cudaError_t LaunchMseForward(const float* y, const float* target, int64_t n, double* partials, float* loss,
                             cudaStream_t stream) {
  MsePartialsKernel<<<kMseBlocks, kMseThreads, 0, stream>>>(y, target, n, partials);
  MseFinishKernel<<<1, 1, 0, stream>>>(partials, kMseBlocks, n, loss);
  return cudaGetLastError();
}

cudaError_t LaunchMseBackward(const float* y, const float* target, int64_t n, double scale, float* dy,
                              cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const int64_t blocks = (n + kMseThreads - 1) / kMseThreads;
  MseBackwardKernel<<<static_cast<int>(blocks < 4096 ? blocks : 4096), kMseThreads, 0, stream>>>(y, target, n,
                                                                                                  scale, dy);
  return cudaGetLastError();
}

}  // namespace cuda
}  // namespace kernels
}  // namespace teserve
