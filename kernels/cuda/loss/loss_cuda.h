// CUDA cross entropy (contract: kernels/loss.h). The dispatcher has checked the logits
// (FP32 [..., V] on ctx's CUDA device) and the labels, which stay on the host: they are
// widened to INT64 and copied to the device here. The forward synchronizes ctx.stream
// to return the mean loss (per-token losses summed on the host in double, as the CPU
// reference does); lse and per_token_loss are device tensors.
#ifndef TESERVE_KERNELS_CUDA_LOSS_CUDA_H_
#define TESERVE_KERNELS_CUDA_LOSS_CUDA_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "core/context.h"
#include "core/tensor.h"
#include "kernels/loss.h"

namespace teserve {
namespace kernels {
namespace cuda {

absl::StatusOr<CrossEntropyForwardOutput> CrossEntropyForward(const Context& ctx, const Tensor& logits,
                                                              const Tensor& labels,
                                                              const CrossEntropyOptions& options);

absl::StatusOr<Tensor> CrossEntropyBackward(const Context& ctx, const Tensor& logits, const Tensor& labels,
                                            const Tensor& lse, int64_t num_valid,
                                            const CrossEntropyOptions& options, float grad_loss);

// MSE with y and target on ctx's CUDA device: the forward waits for ctx.stream to read
// the loss (one FP32 word); the backward only enqueues.
absl::StatusOr<MseForwardOutput> MseForward(const Context& ctx, const Tensor& y, const Tensor& target);
absl::StatusOr<Tensor> MseBackward(const Context& ctx, const Tensor& y, const Tensor& target, float grad_loss);

}  // namespace cuda
}  // namespace kernels
}  // namespace teserve

#endif  // TESERVE_KERNELS_CUDA_LOSS_CUDA_H_
