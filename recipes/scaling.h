// Scale rules of the per-tensor FP8 recipes and the state delayed scaling keeps.
//
// Delayed scaling (TE's DelayedScaling): each quantized tensor keeps an amax history
// of amax_history_len slots, zero-initialized, and a scale starting at 1. Quantizing
// records the tensor's amax in slot 0 (max with what the region already recorded).
// At the end of the region (a Forward for forward tensors, a Backward for gradients):
//   amax  = max over the window (kMax) or slot 0 (kMostRecent)
//   roll the window by one (slot 0 moves to the end), zero slot 0; the roll is skipped
//         when slot 0 is 0 (the layer did not run in this region)
//   scale = (fp8_max / amax) / 2^margin; amax 0, Inf or NaN keeps the previous scale;
//         an infinite scale becomes FLT_MAX.
// So step t quantizes with a scale computed from amaxes up to step t-1.
//
// Current scaling (TE's Float8CurrentScaling): scale = fp8_max / max(amax, epsilon) from
// the tensor's own amax; amax 0, Inf or NaN gives 1; Inf becomes FLT_MAX; with
// power_2_scale the scale is rounded down to a power of two (mantissa bits cleared).
#ifndef TESERVE_RECIPES_SCALING_H_
#define TESERVE_RECIPES_SCALING_H_

#include <utility>
#include <vector>

#include "recipes/recipe.h"

namespace teserve {
namespace recipes {

// (fp8_max / amax) / 2^margin, or `previous_scale` when amax is 0, Inf or NaN.
float DelayedScale(float amax, float fp8_max, float margin, float previous_scale);

// fp8_max / max(amax, epsilon) with the rules above.
float CurrentScale(float amax, float fp8_max, float amax_epsilon, bool power_2_scale);

class ScalingState {
 public:
  ScalingState(const DelayedScalingConfig& config, float fp8_max);

  // Records the amax of one quantization in this region (slot 0 keeps the max).
  void RecordAmax(float amax);
  // Ends the region: computes the new scale from the window and rolls it.
  void Update();

  // Checkpoints: the scale and history as history() and scale() returned them (the
  // caller checks the history length).
  void Restore(float scale, std::vector<float> history) {
    scale_ = scale;
    history_ = std::move(history);
  }

  float scale() const { return scale_; }
  float scale_inv() const { return 1.0f / scale_; }
  const std::vector<float>& history() const { return history_; }

 private:
  DelayedScalingConfig config_;
  float fp8_max_;
  float scale_ = 1.0f;
  std::vector<float> history_;
};

}  // namespace recipes
}  // namespace teserve

#endif  // TESERVE_RECIPES_SCALING_H_
