// Built-in losses of the ForwardBackward RPC, forward and backward. Inputs are FP32; the
// loss and the gradient are FP32 (the CPU reference accumulates in FP64).
//
// MSE (mean over elements). y, target: FP32 of the same shape, n elements.
//   loss = (1/n) sum_k (y_k - t_k)^2            (0 when n = 0)
//   dy_k = grad_loss * (2/n) (y_k - t_k)
//
// Cross entropy (TE's parallel_cross_entropy on one device). logits: FP32 [..., V],
// V >= 1, N tokens (the product of the leading dimensions); labels: INT64 or INT32 of
// the leading shape (N values), each in [0, V) or equal to ignore_index. With
// s = label_smoothing in [0, 1] and lse_r = log sum_j exp(x_rj), token r with label y_r
// has the cross entropy against the smoothed target q_r = (1 - s) onehot(y_r) + s / V:
//   loss_r = (1 - s) (lse_r - x_{r,y_r}) + s (lse_r - (1/V) sum_j x_rj)
//   d loss_r / d x_rj = softmax(x_r)_j - s / V - (1 - s) [j == y_r]
// A token whose label is ignore_index has loss_r = 0 and a zero gradient row.
// Reduction: the mean over the non-ignored tokens (n_valid of them):
//   loss = (1 / n_valid) sum_r loss_r      (0 when every token is ignored)
//   dx_r = grad_loss * (d loss_r / d x_r) / n_valid
// TE's reduce_loss=True divides by the non-ignored count the same way (TE PR 2476);
// reduce_loss=False corresponds to per_token_loss below.
//
// All metadata errors are INVALID_ARGUMENT naming the argument ("labels[3]: expected a
// class in [0, 10) or ignore_index -100, got 12"). Cross entropy also runs on CUDA
// devices: logits (and lse for the backward) on the Context's CUDA device, labels on the
// host; FP32 math there, results within FP32 rounding of the CPU reference. MSE also
// runs on CUDA (y and target on the device): its gradient equals the CPU's bit for bit,
// its loss sums in double in another order (within FP32 rounding of the CPU's).
#ifndef TESERVE_KERNELS_LOSS_H_
#define TESERVE_KERNELS_LOSS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/context.h"
#include "core/tensor.h"

namespace teserve {
namespace kernels {

struct MseForwardOutput {
  float loss = 0.0f;
  int64_t num_elements = 0;
};

absl::StatusOr<MseForwardOutput> MseForward(const Context& ctx, const Tensor& y, const Tensor& target);

// dy, FP32 of y's shape.
absl::StatusOr<Tensor> MseBackward(const Context& ctx, const Tensor& y, const Tensor& target, float grad_loss);

struct CrossEntropyOptions {
  float label_smoothing = 0.0f;  // TE's default
  int64_t ignore_index = -100;   // TE's ignore_idx default
};

struct CrossEntropyForwardOutput {
  float loss = 0.0f;          // mean over the non-ignored tokens
  int64_t num_valid = 0;      // non-ignored tokens
  Tensor per_token_loss;      // FP32, the labels' shape; 0 for ignored tokens
  Tensor lse;                 // FP32 [N]: log-sum-exp per token, for the backward
};

absl::StatusOr<CrossEntropyForwardOutput> CrossEntropyForward(const Context& ctx, const Tensor& logits,
                                                              const Tensor& labels,
                                                              const CrossEntropyOptions& options);

// dx, FP32 of the logits' shape; lse and num_valid as the forward returned them.
absl::StatusOr<Tensor> CrossEntropyBackward(const Context& ctx, const Tensor& logits, const Tensor& labels,
                                            const Tensor& lse, int64_t num_valid,
                                            const CrossEntropyOptions& options, float grad_loss);

// The label checks of the cross-entropy entry points, for callers that validate a
// request before running anything: labels INT64 or INT32 of shape `leading_shape`, on
// the CPU, each in [0, num_classes) or equal to ignore_index; errors name `field`
// ("target.dtype", "target[3]").
absl::Status CheckCrossEntropyLabels(const Tensor& labels, const Shape& leading_shape, int64_t num_classes,
                                     int64_t ignore_index, absl::string_view field);

// label_smoothing finite and in [0, 1]; errors name `field`.
absl::Status CheckLabelSmoothing(float label_smoothing, absl::string_view field);

}  // namespace kernels
}  // namespace teserve

#endif  // TESERVE_KERNELS_LOSS_H_
