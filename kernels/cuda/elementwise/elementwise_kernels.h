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

}  // namespace cuda
}  // namespace kernels
}  // namespace teserve

#endif  // TESERVE_KERNELS_CUDA_ELEMENTWISE_ELEMENTWISE_KERNELS_H_
