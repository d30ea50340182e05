// CPU reference for kernels/softmax.h: scaled softmax (plain, padding mask, causal
// top-left / bottom-right) forward and backward, row sums in FP64.
//
// Assumes the checks of kernels/softmax.cc have passed (FP32 CPU tensors of rank 4;
// mask BOOL [batches, 1, sq, sk] iff kind is kPadding); call the kernels:: entry points
// for checked use.
#ifndef TESERVE_KERNELS_CPU_SOFTMAX_CPU_H_
#define TESERVE_KERNELS_CPU_SOFTMAX_CPU_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "core/tensor.h"
#include "kernels/softmax.h"

namespace teserve {
namespace kernels {
namespace cpu {

absl::StatusOr<Tensor> ScaledSoftmaxForward(const Tensor& x, float scale, SoftmaxMask kind, const Tensor& mask);

absl::StatusOr<Tensor> ScaledSoftmaxBackward(const Tensor& y, const Tensor& dy, float scale);

// Whether key j of query row i is masked for the causal variants (false for kNone and
// kPadding, whose mask is read from the tensor).
inline bool CausallyMasked(SoftmaxMask kind, int64_t i, int64_t j, int64_t sq, int64_t sk) {
  if (kind == SoftmaxMask::kCausalTopLeft) return j > i;
  if (kind == SoftmaxMask::kCausalBottomRight) return j > i + sk - sq;
  return false;
}

}  // namespace cpu
}  // namespace kernels
}  // namespace teserve

#endif  // TESERVE_KERNELS_CPU_SOFTMAX_CPU_H_
