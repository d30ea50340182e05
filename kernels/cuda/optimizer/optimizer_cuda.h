// CUDA multi-tensor optimizer steps (contract: kernels/optimizer.h). The dispatcher in
// kernels/optimizer.cc has checked the tensors (all on ctx's CUDA device) and computed
// the step scalars. One launch per call on ctx.stream; the chunk table is copied to the
// device first and the stream is synchronized before returning (the table is freed).
#ifndef TESERVE_KERNELS_CUDA_OPTIMIZER_CUDA_H_
#define TESERVE_KERNELS_CUDA_OPTIMIZER_CUDA_H_

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "core/context.h"
#include "kernels/optimizer.h"

namespace teserve {
namespace kernels {
namespace cuda {

absl::Status AdamWStep(const Context& ctx, absl::Span<const OptimizerTensor> tensors,
                       const optimizer_math::AdamWScalars& scalars);

absl::Status SgdStep(const Context& ctx, absl::Span<const OptimizerTensor> tensors,
                     const optimizer_math::SgdScalars& scalars);

}  // namespace cuda
}  // namespace kernels
}  // namespace teserve

#endif  // TESERVE_KERNELS_CUDA_OPTIMIZER_CUDA_H_
