#include "kernels/cuda/elementwise/elementwise_kernels.h"

#include "kernels/cuda/block_reduce.cuh"

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

// One reduction per kernel (the shared array is the function's).
__device__ double BlockSum(double value) {
  __shared__ double shared[kThreads];
  return BlockTreeSum<kThreads>(value, shared);
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

__global__ void __launch_bounds__(kThreads)
    BiasDropoutAddKernel(const float* __restrict__ h, const float* __restrict__ bias,
                         const float* __restrict__ residual, int64_t n, int64_t hidden, ResidualDropout dropout,
                         float* __restrict__ out) {
  const bool active = dropout.active();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * kThreads) {
    float v = __fadd_rn(h[i], bias != nullptr ? bias[i % hidden] : 0.0f);
    if (active) v = __fmul_rn(v, ResidualDropoutFactor(dropout, i, hidden));
    out[i] = __fadd_rn(residual[i], v);
  }
}

__global__ void __launch_bounds__(kThreads)
    DropoutScaleKernel(ResidualDropout dropout, int64_t n, int64_t hidden, float* x) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * kThreads) {
    x[i] = __fmul_rn(x[i], ResidualDropoutFactor(dropout, i, hidden));
  }
}

__global__ void __launch_bounds__(kThreads)
    L2NormForwardKernel(const float* __restrict__ x, int64_t h, float eps, float* __restrict__ y,
                        float* __restrict__ rsigma) {
  const float* row = x + blockIdx.x * h;
  double sum = 0.0;
  for (int64_t j = threadIdx.x; j < h; j += kThreads) sum += static_cast<double>(row[j]) * row[j];
  const double r = 1.0 / sqrt(BlockSum(sum) + eps);
  float* out = y + blockIdx.x * h;
  for (int64_t j = threadIdx.x; j < h; j += kThreads) out[j] = static_cast<float>(row[j] * r);
  if (threadIdx.x == 0) rsigma[blockIdx.x] = static_cast<float>(r);
}

__global__ void __launch_bounds__(kThreads)
    L2NormBackwardKernel(const float* __restrict__ dy, const float* __restrict__ x, const float* __restrict__ rsigma,
                         int64_t h, float* __restrict__ dx) {
  const float* xr = x + blockIdx.x * h;
  const float* dyr = dy + blockIdx.x * h;
  double dot = 0.0;
  for (int64_t j = threadIdx.x; j < h; j += kThreads) dot += static_cast<double>(dyr[j]) * xr[j];
  const double r = rsigma[blockIdx.x];
  const double r3_dot = r * r * r * BlockSum(dot);
  float* out = dx + blockIdx.x * h;
  for (int64_t j = threadIdx.x; j < h; j += kThreads) out[j] = static_cast<float>(r * dyr[j] - r3_dot * xr[j]);
}

}  // namespace

cudaError_t LaunchBiasDropoutAdd(const float* h, const float* bias, const float* residual, int64_t n, int64_t hidden,
                                 const ResidualDropout& dropout, float* out, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  BiasDropoutAddKernel<<<GridFor(n), kThreads, 0, stream>>>(h, bias, residual, n, hidden, dropout, out);
  return cudaGetLastError();
}

cudaError_t LaunchDropoutScale(const ResidualDropout& dropout, int64_t n, int64_t hidden, float* x,
                               cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  DropoutScaleKernel<<<GridFor(n), kThreads, 0, stream>>>(dropout, n, hidden, x);
  return cudaGetLastError();
}

cudaError_t LaunchL2NormForward(const float* x, int64_t rows, int64_t h, float eps, float* y, float* rsigma,
                                cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  L2NormForwardKernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(x, h, eps, y, rsigma);
  return cudaGetLastError();
}

cudaError_t LaunchL2NormBackward(const float* dy, const float* x, const float* rsigma, int64_t rows, int64_t h,
                                 float* dx, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  L2NormBackwardKernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(dy, x, rsigma, h, dx);
  return cudaGetLastError();
}

constexpr int kGatherWarps = 8;

__global__ void __launch_bounds__(kGatherWarps * 32)
    GatherKernel(const GatherPiece* __restrict__ pieces, int64_t count, char* __restrict__ dst) {
  const int lane = threadIdx.x % 32;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kGatherWarps;
  for (int64_t w = blockIdx.x * static_cast<int64_t>(kGatherWarps) + threadIdx.x / 32; w < count; w += warps) {
    const GatherPiece p = pieces[w];
    const char* src = static_cast<const char*>(p.src);
    char* out = dst + p.dst_offset;
    uint64_t done = 0;
    if (((reinterpret_cast<uintptr_t>(src) | reinterpret_cast<uintptr_t>(out)) & 15u) == 0) {
      const uint64_t vectors = p.bytes / 16;
      const uint4* from = reinterpret_cast<const uint4*>(src);
      uint4* to = reinterpret_cast<uint4*>(out);
      for (uint64_t i = lane; i < vectors; i += 32) to[i] = from[i];
      done = vectors * 16;
    }
    for (uint64_t i = done + lane; i < p.bytes; i += 32) out[i] = src[i];
  }
}

cudaError_t LaunchGather(const GatherPiece* pieces, int64_t count, char* dst, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  const int64_t blocks = (count + kGatherWarps - 1) / kGatherWarps;
  GatherKernel<<<static_cast<int>(blocks < 65535 ? blocks : 65535), kGatherWarps * 32, 0, stream>>>(pieces, count,
                                                                                                      dst);
  return cudaGetLastError();
}

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
