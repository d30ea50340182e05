// Scaled softmax over the last dimension of attention scores, for the unfused attention
// path. x: FP32 [batches, heads, sq, sk]; row (b, h, i) is normalized over its keys j.
//
// Variants (which keys of row i are masked, i.e. get -inf before the softmax):
//   kNone               none:           y = softmax(scale * x)
//   kPadding            mask[b, 0, i, j] is true (mask: BOOL [batches, 1, sq, sk],
//                       broadcast over heads; true = masked)
//   kCausalTopLeft      j > i
//   kCausalBottomRight  j > i + sk - sq  (the diagonal ends at the last key)
// A row whose keys are all masked gives zeros (not NaN).
//
// Backward, from the forward's output y and the gradient dy (FP32, x's shape):
//   dx = scale * y * (dy - sum_j dy_j y_j)
// Masked positions have y = 0 and so dx = 0: the backward needs no mask.
//
// The CPU reference accumulates the row sums in FP64; the CUDA kernels (x, mask, y, dy on
// the Context's CUDA device) do FP32 math, within FP32 rounding of the CPU reference.
// Metadata errors are INVALID_ARGUMENT naming the argument and saying expected vs got.
#ifndef TESERVE_KERNELS_SOFTMAX_H_
#define TESERVE_KERNELS_SOFTMAX_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/context.h"
#include "core/tensor.h"

namespace teserve {
namespace kernels {

enum class SoftmaxMask { kNone, kPadding, kCausalTopLeft, kCausalBottomRight };

const char* SoftmaxMaskName(SoftmaxMask kind);

// y, FP32 of x's shape. `mask` must be given for kPadding and only for it.
absl::StatusOr<Tensor> ScaledSoftmaxForward(const Context& ctx, const Tensor& x, float scale, SoftmaxMask kind,
                                            const Tensor& mask = Tensor());

// dx, FP32 of y's shape.
absl::StatusOr<Tensor> ScaledSoftmaxBackward(const Context& ctx, const Tensor& y, const Tensor& dy, float scale);

}  // namespace kernels
}  // namespace teserve

#endif  // TESERVE_KERNELS_SOFTMAX_H_
