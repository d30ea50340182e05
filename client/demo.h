// The teserve demo: trains a small FP8 stack remotely on a learnable task and reports
// the loss per step and the final quantization state. A library so tests run exactly
// what `teserve_cli demo` runs.
//
// Task (teacher-student regression): a fixed random teacher of the same architecture
// (its own session, high precision, larger weights so the targets are O(1)) maps random
// inputs to targets; the student, LayerNorm(32) -> Linear(32,64) -> RMSNorm(64) ->
// Linear(64,32) under one recipe (DelayedScaling HYBRID with amax_history_len 16 by
// default; Float8CurrentScaling, MXFP8, FP8 block scaling or NVFP4 on request) with
// AdamW, learns it by MSE. Every Linear width and the default batch (64 tokens) are
// multiples of 32, so MXFP8 (32) and NVFP4 (16) blocks tile them. The loss and its gradient dL/dy = 2 (y - t) / numel are computed here, on the
// client, and sent to Backward.
#ifndef TESERVE_CLIENT_DEMO_H_
#define TESERVE_CLIENT_DEMO_H_

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "client/client.h"
#include "teserve/v1/service.pb.h"

namespace teserve {
namespace client {

struct DemoOptions {
  int steps = 200;
  uint64_t seed = 1;
  int batch = 64;
  float lr = 1e-2f;
  // The student's recipe: one of DemoRecipeNames().
  std::string recipe = "delayed";
  // The student's LayerSpec.params_dtype (FLOAT32, BFLOAT16 or FLOAT16).
  v1::DType params_dtype = v1::FLOAT32;
  // Receives "step N loss X" per step when set.
  std::ostream* log = nullptr;
};

struct DemoResult {
  std::vector<float> losses;           // one per step, before that step's update
  v1::QuantizationState quantization;  // of the student after the last step
};

// The recipes the demo accepts, in RecipeSpec order: delayed, current, mxfp8, block, nvfp4.
const std::vector<std::string>& DemoRecipeNames();

// The demo architecture under `recipe` (one of DemoRecipeNames(), or "" for high
// precision everywhere: the teacher, which never steps). InvalidArgument naming the
// accepted values for anything else.
// Sets params_dtype on every layer of `model`; FLOAT32 leaves the spec as it is.
void SetParamsDType(v1::ModelSpec* model, v1::DType params_dtype);

// "float32", "bfloat16" / "bf16", "float16" / "fp16" (the CLI's --params_dtype);
// INVALID_ARGUMENT naming the flag otherwise.
absl::StatusOr<v1::DType> ParseParamsDType(absl::string_view text);

absl::StatusOr<v1::CreateSessionRequest> DemoSessionRequestFor(uint64_t seed, float init_std,
                                                               absl::string_view recipe,
                                                               float lr);

// The demo architecture. fp8 selects the student's DelayedScaling recipe; without it the
// session runs in high precision.
v1::CreateSessionRequest DemoSessionRequest(uint64_t seed, float init_std, bool fp8,
                                            float lr);

// Runs the demo. Both sessions are deleted before returning, also on error.
absl::StatusOr<DemoResult> RunDemo(Client& client, const DemoOptions& options);

// A fixed-width table: layer, tensor, recipe, format, mode, execution, amax, scale,
// scale_inv, then the block scale_inv min/max/mean ("-" for per-tensor recipes) and, when
// any tensor carries FP8 health stats, underflow/overflow ratio, MSE and dynamic range.
std::string FormatQuantizationTable(const v1::QuantizationState& state);

}  // namespace client
}  // namespace teserve

#endif  // TESERVE_CLIENT_DEMO_H_
