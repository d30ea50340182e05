#include "recipes/scaling.h"

#include <algorithm>
#include <cfloat>
#include <cmath>

#include "kernels/scaling_math.h"

namespace teserve {
namespace recipes {
namespace {

bool IsUsableAmax(float amax) { return std::isfinite(amax) && amax > 0.0f; }

float ClampInfiniteScale(float scale) { return std::isinf(scale) ? FLT_MAX : scale; }

// NaN-propagating max, as a reduction over amaxes must be.
float NanMax(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return NAN;
  return std::max(a, b);
}

}  // namespace

float DelayedScale(float amax, float fp8_max, float margin, float previous_scale) {
  if (!IsUsableAmax(amax)) return previous_scale;
  const float scale = (fp8_max / amax) / std::exp2(margin);
  return ClampInfiniteScale(scale);
}

float CurrentScale(float amax, float fp8_max, float amax_epsilon, bool power_2_scale) {
  // One implementation for the host and the device (the CUDA cast computes it from the
  // amax it leaves on the device).
  return kernels::scaling_math::CurrentScale(amax, fp8_max, amax_epsilon, power_2_scale);
}

ScalingState::ScalingState(const DelayedScalingConfig& config, float fp8_max)
    : config_(config), fp8_max_(fp8_max), history_(config.amax_history_len, 0.0f) {}

void ScalingState::RecordAmax(float amax) { history_[0] = NanMax(history_[0], amax); }

void ScalingState::Update() {
  float amax = history_[0];
  if (config_.amax_compute_algo == AmaxComputeAlgo::kMax) {
    for (float a : history_) amax = NanMax(amax, a);
  }
  scale_ = DelayedScale(amax, fp8_max_, config_.margin, scale_);
  if (history_[0] != 0.0f) {
    std::rotate(history_.begin(), history_.begin() + 1, history_.end());
    history_[0] = 0.0f;
  }
}

}  // namespace recipes
}  // namespace teserve
