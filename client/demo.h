// The teserve demo: trains a small FP8 stack remotely on a learnable task and reports
// the loss per step and the final quantization state. A library so tests run exactly
// what `teserve_cli demo` runs.
//
// Task (teacher-student regression): a fixed random teacher of the same architecture
// (its own session, high precision, larger weights so the targets are O(1)) maps random
// inputs to targets; the student, LayerNorm(32) -> Linear(32,64) -> RMSNorm(64) ->
// Linear(64,16) under DelayedScaling (HYBRID, amax_history_len 16) with AdamW, learns it
// by MSE. The loss and its gradient dL/dy = 2 (y - t) / numel are computed here, on the
// client, and sent to Backward.
#ifndef TESERVE_CLIENT_DEMO_H_
#define TESERVE_CLIENT_DEMO_H_

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/client.h"
#include "teserve/v1/service.pb.h"

namespace teserve {
namespace client {

struct DemoOptions {
  int steps = 200;
  uint64_t seed = 1;
  int batch = 64;
  float lr = 1e-2f;
  // Receives "step N loss X" per step when set.
  std::ostream* log = nullptr;
};

struct DemoResult {
  std::vector<float> losses;           // one per step, before that step's update
  v1::QuantizationState quantization;  // of the student after the last step
};

// The demo architecture. fp8 selects the student's DelayedScaling recipe; without it the
// session runs in high precision (the teacher, which never steps).
v1::CreateSessionRequest DemoSessionRequest(uint64_t seed, float init_std, bool fp8,
                                            float lr);

// Runs the demo. Both sessions are deleted before returning, also on error.
absl::StatusOr<DemoResult> RunDemo(Client& client, const DemoOptions& options);

// A fixed-width table: layer, tensor, format, amax, scale, scale_inv.
std::string FormatQuantizationTable(const v1::QuantizationState& state);

}  // namespace client
}  // namespace teserve

#endif  // TESERVE_CLIENT_DEMO_H_
