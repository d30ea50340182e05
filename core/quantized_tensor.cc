#include "core/quantized_tensor.h"

namespace teserve {

absl::string_view ScalingModeName(ScalingMode mode) {
  switch (mode) {
    case ScalingMode::kPerTensor: return "per_tensor";
    case ScalingMode::kMxfp8_1D: return "mxfp8_1d";
    case ScalingMode::kBlock1D: return "block_1d";
    case ScalingMode::kBlock2D: return "block_2d";
    case ScalingMode::kNvfp4_1D: return "nvfp4_1d";
    case ScalingMode::kNvfp4_2D: return "nvfp4_2d";
  }
  return "unknown";
}

}  // namespace teserve
