// Launchers of the scaled-softmax kernels (softmax_kernels.cu), contract kernels/softmax.h.
// One block per row of sk scores (rows beyond the grid handled by a block-stride loop);
// FP32 math with warp-shuffle block reductions. Light header (CUDA runtime only); the
// launchers do not synchronize and return cudaGetLastError after the launch.
#ifndef TESERVE_KERNELS_CUDA_SOFTMAX_KERNELS_H_
#define TESERVE_KERNELS_CUDA_SOFTMAX_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace teserve {
namespace kernels {
namespace cuda {

// Which keys are masked; values match kernels::SoftmaxMask.
enum class SoftmaxMaskKind : int { kNone = 0, kPadding = 1, kCausalTopLeft = 2, kCausalBottomRight = 3 };

struct SoftmaxLaunchParams {
  int64_t batches = 0;
  int64_t heads = 0;
  int64_t sq = 0;
  int64_t sk = 0;
  float scale = 1.0f;
  SoftmaxMaskKind kind = SoftmaxMaskKind::kNone;
  const uint8_t* mask = nullptr;  // [batches, 1, sq, sk], nonzero = masked; kPadding only
};

// y = softmax over j of scale * x with masked keys excluded; fully masked rows are zero.
cudaError_t LaunchScaledSoftmaxForward(const SoftmaxLaunchParams& params, const float* x, float* y,
                                       cudaStream_t stream);

// dx = scale * y * (dy - sum_j dy_j y_j); params.kind and params.mask are unused.
cudaError_t LaunchScaledSoftmaxBackward(const SoftmaxLaunchParams& params, const float* y, const float* dy,
                                        float* dx, cudaStream_t stream);

}  // namespace cuda
}  // namespace kernels
}  // namespace teserve

#endif  // TESERVE_KERNELS_CUDA_SOFTMAX_KERNELS_H_
