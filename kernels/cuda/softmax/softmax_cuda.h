// CUDA scaled softmax forward / backward (contract: kernels/softmax.h). The dispatcher has
// checked the tensors (FP32 rank 4 on ctx's CUDA device; mask BOOL [batches, 1, sq, sk]
// there iff kind is kPadding). Outputs are new device tensors; nothing synchronizes.
#ifndef TESERVE_KERNELS_CUDA_SOFTMAX_CUDA_H_
#define TESERVE_KERNELS_CUDA_SOFTMAX_CUDA_H_

#include "absl/status/statusor.h"
#include "core/context.h"
#include "core/tensor.h"
#include "kernels/softmax.h"

namespace teserve {
namespace kernels {
namespace cuda {

absl::StatusOr<Tensor> ScaledSoftmaxForward(const Context& ctx, const Tensor& x, float scale, SoftmaxMask kind,
                                            const Tensor& mask);

absl::StatusOr<Tensor> ScaledSoftmaxBackward(const Context& ctx, const Tensor& y, const Tensor& dy, float scale);

}  // namespace cuda
}  // namespace kernels
}  // namespace teserve

#endif  // TESERVE_KERNELS_CUDA_SOFTMAX_CUDA_H_
