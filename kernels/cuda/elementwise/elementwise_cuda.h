// CUDA backend of kernels/elementwise.h (checks done by kernels/elementwise.cc). Work is
// enqueued on ctx.stream; SumOfSquares waits for its one value (the only host read).
#ifndef TESERVE_KERNELS_CUDA_ELEMENTWISE_ELEMENTWISE_CUDA_H_
#define TESERVE_KERNELS_CUDA_ELEMENTWISE_ELEMENTWISE_CUDA_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/context.h"
#include "core/tensor.h"

namespace teserve {
namespace kernels {
namespace cuda {

absl::Status AddInto(const Context& ctx, const Tensor& x, Tensor* into);
absl::Status Scale(const Context& ctx, float factor, Tensor* x);
absl::StatusOr<double> SumOfSquares(const Context& ctx, absl::Span<const Tensor> tensors);
absl::Status FillZero(const Context& ctx, Tensor* x);
absl::Status CopyInto(const Context& ctx, const Tensor& src, Tensor* dst);
// A copy of t on `device`, one of the two sides being a CUDA device.
absl::StatusOr<Tensor> CopyTo(const Context& ctx, const Tensor& t, Device device);

}  // namespace cuda
}  // namespace kernels
}  // namespace teserve

#endif  // TESERVE_KERNELS_CUDA_ELEMENTWISE_ELEMENTWISE_CUDA_H_
