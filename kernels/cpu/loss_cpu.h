// CPU reference for kernels/loss.h: MSE and cross entropy, forward and backward.
//
// Assumes the checks of kernels/loss.cc have passed (FP32 CPU tensors of matching
// shapes; labels INT64 or INT32, each in [0, V) or ignore_index; label_smoothing in
// [0, 1]); call the kernels:: entry points for checked use.
#ifndef TESERVE_KERNELS_CPU_LOSS_CPU_H_
#define TESERVE_KERNELS_CPU_LOSS_CPU_H_

#include "absl/status/statusor.h"
#include "core/tensor.h"
#include "kernels/loss.h"

namespace teserve {
namespace kernels {
namespace cpu {

absl::StatusOr<MseForwardOutput> MseForward(const Tensor& y, const Tensor& target);

absl::StatusOr<Tensor> MseBackward(const Tensor& y, const Tensor& target, float grad_loss);

absl::StatusOr<CrossEntropyForwardOutput> CrossEntropyForward(const Tensor& logits, const Tensor& labels,
                                                              const CrossEntropyOptions& options);

absl::StatusOr<Tensor> CrossEntropyBackward(const Tensor& logits, const Tensor& labels, const Tensor& lse,
                                            int64_t num_valid, const CrossEntropyOptions& options,
                                            float grad_loss);

}  // namespace cpu
}  // namespace kernels
}  // namespace teserve

#endif  // TESERVE_KERNELS_CPU_LOSS_CPU_H_
