// Launchers of the cross-entropy kernels (loss_kernels.cu), contract kernels/loss.h.
// One block per token row; FP32 math throughout. Light header (CUDA runtime only); the
// launchers do not synchronize and return cudaGetLastError after the launch.
#ifndef TESERVE_KERNELS_CUDA_LOSS_KERNELS_H_
#define TESERVE_KERNELS_CUDA_LOSS_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace teserve {
namespace kernels {
namespace cuda {

struct CrossEntropyLaunchParams {
  const float* logits = nullptr;  // [n, v]
  const int64_t* labels = nullptr;  // [n], each in [0, v) or ignore_index
  int64_t n = 0;
  int64_t v = 0;
  int64_t ignore_index = -100;
  float label_smoothing = 0.0f;
};

// lse[r] = max_r + log(sum_j exp(x_rj - max_r)); per_token_loss[r] as kernels/loss.h
// (0 for ignored tokens).
cudaError_t LaunchCrossEntropyForward(const CrossEntropyLaunchParams& params, float* lse, float* per_token_loss,
                                      cudaStream_t stream);

// dx_rj = scale * (exp(x_rj - lse_r) - s/V - (1 - s)[j == y_r]), scale = grad_loss /
// num_valid (FP32); zero rows for ignored tokens.
cudaError_t LaunchCrossEntropyBackward(const CrossEntropyLaunchParams& params, const float* lse, float scale,
                                       float* dx, cudaStream_t stream);

// MSE. The forward sums (y_k - t_k)^2 in double: kMseBlocks block partials over
// grid-stride shares (a tree in shared memory), then one thread adds them in index order
// and writes *loss = sum / n in FP32 (0 when n = 0). No atomics: the same bits every run.
// The backward writes dy_k = (float)(scale * ((double)y_k - t_k)), the CPU reference's
// expression, so dy equals the CPU's bit for bit.
inline constexpr int kMseBlocks = 256;
cudaError_t LaunchMseForward(const float* y, const float* target, int64_t n, double* partials, float* loss,
                             cudaStream_t stream);
cudaError_t LaunchMseBackward(const float* y, const float* target, int64_t n, double scale, float* dy,
                              cudaStream_t stream);

}  // namespace cuda
}  // namespace kernels
}  // namespace teserve

#endif  // TESERVE_KERNELS_CUDA_LOSS_KERNELS_H_
