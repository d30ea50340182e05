// Loss helpers shared by the CPU reference (kernels/cpu/loss_cpu.cc), the checked entry
// points (kernels/loss.cc) and the host side of the CUDA cross entropy
// (kernels/cuda/loss_cuda.cc). Host code: it reads tensors through core/tensor.h.
#ifndef TESERVE_KERNELS_LOSS_MATH_H_
#define TESERVE_KERNELS_LOSS_MATH_H_

#include <cstdint>

#include "core/tensor.h"

namespace teserve {
namespace kernels {
namespace loss_math {

// Label r of an INT64 or INT32 host tensor of class labels, widened.
inline int64_t LabelAt(const Tensor& labels, int64_t r) {
  if (labels.dtype() == DType::kInt32) return labels.data<int32_t>()[r];
  return labels.data<int64_t>()[r];
}

}  // namespace loss_math
}  // namespace kernels
}  // namespace teserve

#endif  // TESERVE_KERNELS_LOSS_MATH_H_
