// Launchers of kernels/elementwise.h's FP32 kernels (elementwise_kernels.cu). Light
// header (CUDA runtime only); the launchers do not synchronize and return
// cudaGetLastError after the launch.
//
// SumOfSquares: each block reduces a grid-stride share of one tensor into a double
// partial (fixed block size, tree in shared memory), written to partials[block]; a
// second single-block launch adds the partials in index order. No atomics, so the
// result is the same on every run.
#ifndef TESERVE_KERNELS_CUDA_ELEMENTWISE_ELEMENTWISE_KERNELS_H_
#define TESERVE_KERNELS_CUDA_ELEMENTWISE_ELEMENTWISE_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/dropout_math.h"

namespace teserve {
namespace kernels {
namespace cuda {

inline constexpr int kSumOfSquaresBlocks = 256;  // partials per tensor

cudaError_t LaunchAddInto(const float* x, int64_t n, float* into, cudaStream_t stream);
cudaError_t LaunchScale(float factor, int64_t n, float* x, cudaStream_t stream);
// partials[0 .. kSumOfSquaresBlocks) receive the block sums of x[0 .. n).
cudaError_t LaunchSumOfSquaresPartials(const float* x, int64_t n, double* partials, cudaStream_t stream);
// *sum = partials[0] + ... + partials[count - 1], in that order.
cudaError_t LaunchSumPartials(const double* partials, int64_t count, double* sum, cudaStream_t stream);

// out[i] = residual[i] + factor(i) * (h[i] + bias[i % hidden]) (bias may be null; no
// multiply when !dropout.active()), every operation rounded on its own (no FMA), as
// the CPU reference computes it.
cudaError_t LaunchBiasDropoutAdd(const float* h, const float* bias, const float* residual, int64_t n, int64_t hidden,
                                 const ResidualDropout& dropout, float* out, cudaStream_t stream);
// x[i] *= factor(i).
cudaError_t LaunchDropoutScale(const ResidualDropout& dropout, int64_t n, int64_t hidden, float* x,
                               cudaStream_t stream);

// L2 normalization of rows (kernels/l2_norm.h): one block per row, sums in double
// reduced in a fixed order, so results do not depend on the launch.
cudaError_t LaunchL2NormForward(const float* x, int64_t rows, int64_t h, float eps, float* y, float* rsigma,
                                cudaStream_t stream);
cudaError_t LaunchL2NormBackward(const float* dy, const float* x, const float* rsigma, int64_t rows, int64_t h,
                                 float* dx, cudaStream_t stream);

// One piece of a gather: `bytes` bytes from device memory at `src` to `dst_offset` in the
// destination buffer.
struct GatherPiece {
  const void* src;
  uint64_t dst_offset;
  uint64_t bytes;
};

// dst[p.dst_offset, + p.bytes) = p.src[0, p.bytes) for each of `count` pieces (`pieces`
// in device memory): many small device tensors packed into one buffer in one launch
// (CopyManyInto's device-to-host batches), instead of one cudaMemcpyAsync each. A warp
// copies a piece, 16 bytes a lane when both ends are 16-byte aligned, else byte by byte.
cudaError_t LaunchGather(const GatherPiece* pieces, int64_t count, char* dst, cudaStream_t stream);

}  // namespace cuda
}  // namespace kernels
}  // namespace teserve

#endif  // TESERVE_KERNELS_CUDA_ELEMENTWISE_ELEMENTWISE_KERNELS_H_
