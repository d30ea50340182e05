// The built-in losses of ForwardBackward, applied to a model's single output. The
// formulas and reductions are kernels/loss.h's:
//   MSE            mean over the output's elements; target FP32 of the output's shape.
//   cross entropy  logits = the output [..., V]; target INT64 / INT32 labels of the
//                  output's leading shape; label smoothing and ignore_index as in TE's
//                  parallel_cross_entropy; mean over the non-ignored tokens.
// num_tokens: the tokens the loss averages over (non-ignored ones for cross entropy,
// every row of the output for MSE).
#ifndef TESERVE_TRAIN_LOSS_H_
#define TESERVE_TRAIN_LOSS_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "core/context.h"
#include "core/tensor.h"
#include "teserve/v1/service.pb.h"

namespace teserve {
namespace train {

struct LossOptions {
  enum class Kind { kMse, kCrossEntropy };
  Kind kind = Kind::kMse;
  float label_smoothing = 0.0f;  // cross entropy
  int64_t ignore_index = -100;   // cross entropy
};

// INVALID_ARGUMENT naming "loss" when no loss is set and
// "loss.cross_entropy.label_smoothing" outside [0, 1].
absl::StatusOr<LossOptions> LossFromProto(const v1::LossSpec& spec);

// Checks `target` against the loss and the output's shape without running anything;
// errors name "target" ("target.shape", "target.dtype", "target[3]").
absl::Status ValidateLossTarget(const LossOptions& loss, const Shape& output_shape, const Tensor& target);

struct LossResult {
  float loss = 0.0f;
  int64_t num_tokens = 0;
  Tensor grad_output;  // d loss / d output, FP32 of the output's shape
};

// Loss and its gradient for `output` (call ValidateLossTarget first).
absl::StatusOr<LossResult> ComputeLoss(const Context& ctx, const LossOptions& loss, const Tensor& output,
                                       const Tensor& target);

}  // namespace train
}  // namespace teserve

#endif  // TESERVE_TRAIN_LOSS_H_
