// CPU reference for kernels/rope.h: the rotary position embedding and its transpose.
//
// Assumes the metadata checks of kernels/rope.cc have passed (FP32 t of the format's
// rank, FP32 [s2, r] freqs with r even and <= d and a row for every position, valid
// INT32 cu_seqlens for thd, CPU tensors); call the kernels:: entry points for checked use.
#ifndef TESERVE_KERNELS_CPU_ROPE_CPU_H_
#define TESERVE_KERNELS_CPU_ROPE_CPU_H_

#include "absl/status/statusor.h"
#include "core/context.h"
#include "core/tensor.h"
#include "kernels/rope.h"

namespace teserve {
namespace kernels {
namespace cpu {

absl::StatusOr<Tensor> RopeForward(const Context& ctx, const Tensor& t, const Tensor& freqs, RopeFormat format,
                                   bool interleaved, const Tensor* cu_seqlens);

absl::StatusOr<Tensor> RopeBackward(const Context& ctx, const Tensor& dy, const Tensor& freqs, RopeFormat format,
                                    bool interleaved, const Tensor* cu_seqlens);

}  // namespace cpu
}  // namespace kernels
}  // namespace teserve

#endif  // TESERVE_KERNELS_CPU_ROPE_CPU_H_
