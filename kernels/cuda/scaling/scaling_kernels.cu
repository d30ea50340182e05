// Delayed-scaling update: warp w of the grid owns quantizer w. The lanes reduce the
// window with a NaN-propagating max (shuffles), lane 0 writes scale and scale_inv, and
// the window is rolled in place in 32-slot steps: every lane reads slot i + 1 of its
// step, the warp syncs, then writes slot i, so each slot is read before it is
// overwritten (slot 0's old value, needed last, is kept in a register).
#include "kernels/cuda/scaling/scaling_kernels.h"

#include "kernels/scaling_math.h"

namespace teserve {
namespace kernels {
namespace cuda {
namespace {

constexpr int kWarpsPerBlock = 8;

__global__ void __launch_bounds__(32 * kWarpsPerBlock) DelayedScalingKernel(DelayedScalingLaunchParams p) {
  if (p.enabled != nullptr && *p.enabled == 0) return;
  const int64_t q = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (q >= p.n) return;  // whole warps leave together
  float* window = p.history + q * p.h;
  const float slot0 = window[0];
  float amax = slot0;
  if (p.use_max) {
    for (int64_t i = lane; i < p.h; i += 32) amax = scaling_math::NanMax(amax, window[i]);
    for (int offset = 16; offset > 0; offset /= 2) {
      amax = scaling_math::NanMax(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, offset));
    }
  }
  if (lane == 0) {
    const float scale = scaling_math::DelayedScale(amax, p.fp8_max[q], p.margin_factor, p.scale[q]);
    p.scale[q] = scale;
    p.scale_inv[q] = __fdiv_rn(1.0f, scale);
  }
  if (slot0 == 0.0f) return;
  for (int64_t base = 0; base < p.h; base += 32) {
    const int64_t i = base + lane;
    float next = 0.0f;
    if (i < p.h) next = i + 1 < p.h ? window[i + 1] : slot0;
    __syncwarp();
    if (i < p.h) window[i] = i == 0 ? 0.0f : next;
    __syncwarp();
  }
}

}  // namespace

cudaError_t LaunchDelayedScalingUpdate(const DelayedScalingLaunchParams& params, cudaStream_t stream) {
  if (params.n <= 0) return cudaSuccess;
  const int64_t blocks = (params.n + kWarpsPerBlock - 1) / kWarpsPerBlock;
  DelayedScalingKernel<<<static_cast<unsigned>(blocks), 32 * kWarpsPerBlock, 0, stream>>>(params);
  return cudaGetLastError();
}

}  // namespace cuda
}  // namespace kernels
}  // namespace teserve
