// Launcher of the delayed-scaling update kernel (scaling_kernels.cu): one launch for N
// quantizers, one warp per quantizer. Light header (CUDA runtime only). Does not
// synchronize; returns cudaGetLastError after the launch.
#ifndef TESERVE_KERNELS_CUDA_SCALING_KERNELS_H_
#define TESERVE_KERNELS_CUDA_SCALING_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace teserve {
namespace kernels {
namespace cuda {

struct DelayedScalingLaunchParams {
  float* history = nullptr;  // [n, h]
  float* scale = nullptr;    // [n]
  float* scale_inv = nullptr;  // [n]
  const float* fp8_max = nullptr;  // [n]
  const int32_t* enabled = nullptr;  // [1] or null (always enabled)
  int64_t n = 0;
  int64_t h = 0;
  bool use_max = true;
  float margin_factor = 1.0f;  // 2^margin
};

cudaError_t LaunchDelayedScalingUpdate(const DelayedScalingLaunchParams& params, cudaStream_t stream);

}  // namespace cuda
}  // namespace kernels
}  // namespace teserve

#endif  // TESERVE_KERNELS_CUDA_SCALING_KERNELS_H_
