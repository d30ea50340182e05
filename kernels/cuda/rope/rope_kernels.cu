// RoPE forward and backward: one thread per element of t, grid-stride. Each thread finds
// its token's position (for thd by a binary search over cu_seqlens), then writes
//   forward:   x[j] cos f[j] + sign(j) x[p] sin f[j]
//   transpose: x[j] cos f[j] - sign(j) x[p] sin f[p]
// with p = partner(j) (kernels/rope.h), in double and rounded to FP32; channels >= r and
// thd padding tokens are copied.
#include "kernels/cuda/rope/rope_kernels.h"

#include <algorithm>

namespace teserve {
namespace kernels {
namespace cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 65535;

// Position of `token`, or -1 for a thd padding token.
__device__ int64_t PositionOf(const RopeLaunchParams& p, int64_t token) {
  switch (p.layout) {
    case RopeLayout::kSbhd:
      return token / p.seq_dim;
    case RopeLayout::kBshd:
      return token % p.seq_dim;
    case RopeLayout::kThd:
      break;
  }
  // Largest k in [0, batch] with cu_seqlens[k] <= token (cu_seqlens[0] = 0 <= token).
  int64_t lo = 0;
  int64_t hi = p.batch;
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (p.cu_seqlens[mid] <= token) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  if (lo == p.batch) return -1;  // at or past cu_seqlens[batch]
  return token - p.cu_seqlens[lo];
}

__global__ void RopeKernel(RopeLaunchParams p) {
  const int64_t total = p.tokens * p.heads * p.d;
  const int64_t token_size = p.heads * p.d;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t j = e % p.d;
    const int64_t token = e / token_size;
    const int64_t pos = j < p.r ? PositionOf(p, token) : -1;
    if (pos < 0) {
      p.out[e] = p.in[e];
      continue;
    }
    int64_t partner;
    double sign;
    if (p.interleaved) {
      partner = j % 2 == 0 ? j + 1 : j - 1;
      sign = j % 2 == 0 ? -1.0 : 1.0;
    } else {
      const int64_t half = p.r / 2;
      partner = j < half ? j + half : j - half;
      sign = j < half ? -1.0 : 1.0;
    }
    const float* f = p.freqs + pos * p.r;
    const double x = p.in[e];
    const double xp = p.in[e - j + partner];
    const double fj = f[j];
    const double rotated = p.transpose ? -sign * xp * sin(static_cast<double>(f[partner])) : sign * xp * sin(fj);
    p.out[e] = static_cast<float>(x * cos(fj) + rotated);
  }
}

}  // namespace

cudaError_t LaunchRope(const RopeLaunchParams& params, cudaStream_t stream) {
  const int64_t total = params.tokens * params.heads * params.d;
  if (total <= 0) return cudaSuccess;
  const int64_t blocks = std::min<int64_t>((total + kThreads - 1) / kThreads, kMaxBlocks);
  RopeKernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(params);
  return cudaGetLastError();
}

}  // namespace cuda
}  // namespace kernels
}  // namespace teserve
