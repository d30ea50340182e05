// CUDA delayed-scaling update (contract: kernels/delayed_scaling.h). The dispatcher has
// checked the tensors (all on ctx's CUDA device). One launch on ctx.stream, no
// synchronization: the results stay on the device for the next quantization.
#ifndef TESERVE_KERNELS_CUDA_SCALING_CUDA_H_
#define TESERVE_KERNELS_CUDA_SCALING_CUDA_H_

#include "absl/status/status.h"
#include "core/context.h"
#include "kernels/delayed_scaling.h"

namespace teserve {
namespace kernels {
namespace cuda {

absl::Status DelayedScalingUpdate(const Context& ctx, const DelayedScalingTensors& tensors, bool use_max,
                                  float margin_factor);

}  // namespace cuda
}  // namespace kernels
}  // namespace teserve

#endif  // TESERVE_KERNELS_CUDA_SCALING_CUDA_H_
