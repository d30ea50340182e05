// CUDA RoPE (contract: kernels/rope.h). The dispatcher in kernels/rope.cc has checked
// the arguments: t (or dy) and freqs FP32 on ctx's CUDA device; cu_seqlens (thd) stays
// on the host, where the checks read it, and is copied to the device here. Runs on
// ctx.stream without waiting for it, except under thd, which synchronizes the stream
// after the launch (its cu_seqlens upload reads pageable host memory).
#ifndef TESERVE_KERNELS_CUDA_ROPE_CUDA_H_
#define TESERVE_KERNELS_CUDA_ROPE_CUDA_H_

#include "absl/status/statusor.h"
#include "core/context.h"
#include "core/tensor.h"
#include "kernels/rope.h"

namespace teserve {
namespace kernels {
namespace cuda {

absl::StatusOr<Tensor> RopeForward(const Context& ctx, const Tensor& t, const Tensor& freqs, RopeFormat format,
                                   bool interleaved, const Tensor* cu_seqlens);

absl::StatusOr<Tensor> RopeBackward(const Context& ctx, const Tensor& dy, const Tensor& freqs, RopeFormat format,
                                    bool interleaved, const Tensor* cu_seqlens);

}  // namespace cuda
}  // namespace kernels
}  // namespace teserve

#endif  // TESERVE_KERNELS_CUDA_ROPE_CUDA_H_
