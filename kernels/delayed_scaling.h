// Delayed-scaling update of many quantizers at once (the end-of-region step of
// recipes/scaling.h ScalingState::Update, for N quantizers in one op / one CUDA launch).
//
// history: FP32 [N, H], quantizer q's amax window (slot 0 = this region's amax);
// scale, scale_inv: FP32 [N]; fp8_max: FP32 [N] (448 for E4M3, 57344 for E5M2 quantizers);
// enabled: optional INT32 [1] on the same device; when it holds 0 nothing changes (a
// device-side switch, so a captured CUDA graph can skip the update without re-capture).
// Per quantizer, as ScalingState::Update:
//   amax  = NaN-propagating max over the H slots (use_max) or slot 0
//   scale = (fp8_max / amax) / 2^margin; amax 0, Inf or NaN keep the scale; Inf -> FLT_MAX
//   scale_inv = 1 / scale
//   unless slot 0 == 0: rotate the window left by one (slot 0 moves to slot H-1), then
//   zero slot 0.
// Results are bit-identical on the CPU and CUDA backends (2^margin is computed once on
// the host with std::exp2 and passed to both).
#ifndef TESERVE_KERNELS_DELAYED_SCALING_H_
#define TESERVE_KERNELS_DELAYED_SCALING_H_

#include "absl/status/status.h"
#include "core/context.h"
#include "core/tensor.h"

namespace teserve {
namespace kernels {

struct DelayedScalingUpdateOptions {
  bool use_max = true;  // false: most_recent (slot 0)
  float margin = 0.0f;
};

struct DelayedScalingTensors {
  Tensor* history = nullptr;
  Tensor* scale = nullptr;
  Tensor* scale_inv = nullptr;
  const Tensor* fp8_max = nullptr;
  const Tensor* enabled = nullptr;  // optional
};

absl::Status DelayedScalingUpdate(const Context& ctx, const DelayedScalingTensors& tensors,
                                  const DelayedScalingUpdateOptions& options);

}  // namespace kernels
}  // namespace teserve

#endif  // TESERVE_KERNELS_DELAYED_SCALING_H_
