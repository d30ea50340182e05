#include "client/fp8_health.h"

#include <algorithm>

#include "absl/strings/str_format.h"

namespace teserve {
namespace client {

float AmaxWindowMax(const v1::QuantizedTensorState& tensor) {
  if (tensor.amax_history().empty()) return tensor.amax();
  return *std::max_element(tensor.amax_history().begin(), tensor.amax_history().end());
}

std::string FormatFp8HealthTable(const v1::QuantizationState& state) {
  std::string out = absl::StrFormat("session %s at step %d\n", state.session_id(), state.step());
  if (state.tensors().empty()) return out + "no quantized tensors (the session has no FP8 recipe)\n";
  int layer_width = 5;
  for (const v1::QuantizedTensorState& t : state.tensors()) {
    layer_width = std::max(layer_width, static_cast<int>(t.layer().size()));
  }
  absl::StrAppendFormat(&out, "%-*s %-11s %-12s %12s %12s %12s %11s %11s %12s %s\n", layer_width, "layer",
                        "tensor", "format", "amax", "window_max", "scale", "underflow_%", "overflow_%", "mse",
                        "execution");
  for (const v1::QuantizedTensorState& t : state.tensors()) {
    absl::StrAppendFormat(&out, "%-*s %-11s %-12s %12.6g %12.6g %12.6g", layer_width, t.layer(), t.tensor(),
                          v1::DType_Name(t.format()), t.amax(), AmaxWindowMax(t), t.scale());
    if (t.has_health()) {
      absl::StrAppendFormat(&out, " %11.4f %11.4f %12.6g", 100.0 * t.health().underflow_ratio(),
                            100.0 * t.health().overflow_ratio(), t.health().mse());
    } else {
      absl::StrAppendFormat(&out, " %11s %11s %12s", "-", "-", "-");
    }
    absl::StrAppendFormat(&out, " %s\n", t.execution());
  }
  return out;
}

}  // namespace client
}  // namespace teserve
