// Host side of the CUDA delayed-scaling update: fills the launch parameters.
#include "kernels/cuda/scaling/scaling_cuda.h"

#include <cuda_runtime_api.h>

#include "core/status.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_entry.h"
#include "kernels/cuda/scaling/scaling_kernels.h"
#include "kernels/cuda/scoped_device.h"

namespace teserve {
namespace kernels {
namespace cuda {

absl::Status DelayedScalingUpdate(const Context& ctx, const DelayedScalingTensors& tensors, bool use_max,
                                  float margin_factor) {
  ASSIGN_OR_RETURN(const ScopedDevice device, EnterDevice(ctx.device.index));
  DelayedScalingLaunchParams p;
  p.history = tensors.history->data<float>();
  p.scale = tensors.scale->data<float>();
  p.scale_inv = tensors.scale_inv->data<float>();
  p.fp8_max = tensors.fp8_max->data<float>();
  p.enabled = tensors.enabled != nullptr ? tensors.enabled->data<int32_t>() : nullptr;
  p.n = tensors.history->dim(0);
  p.h = tensors.history->dim(1);
  p.use_max = use_max;
  p.margin_factor = margin_factor;
  TESERVE_CUDA_RETURN_IF_ERROR(LaunchDelayedScalingUpdate(p, static_cast<cudaStream_t>(ctx.stream)));
  return absl::OkStatus();
}

}  // namespace cuda
}  // namespace kernels
}  // namespace teserve
