// CUDA backend of kernels/elementwise.h (checks done by kernels/elementwise.cc). Work is
// enqueued on ctx.stream; SumOfSquares waits for its one value (the only host read).
#ifndef TESERVE_KERNELS_CUDA_ELEMENTWISE_ELEMENTWISE_CUDA_H_
#define TESERVE_KERNELS_CUDA_ELEMENTWISE_ELEMENTWISE_CUDA_H_

#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/context.h"
#include "core/tensor.h"
#include "kernels/dropout_math.h"
#include "kernels/l2_norm.h"

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
// kernels::CopyManyInto / CopyManyTo (checked there): `device` is the one CUDA device of
// the non-CPU tensors; CopyManyTo's `device` is a CUDA device; chunk_bytes > 0 bounds the
// pinned staging buffer.
absl::Status CopyManyInto(const Context& ctx, Device device, absl::Span<const Tensor* const> srcs,
                          absl::Span<Tensor* const> dsts, int64_t chunk_bytes);
absl::StatusOr<std::vector<Tensor>> CopyManyTo(const Context& ctx, absl::Span<const Tensor* const> tensors,
                                               Device device, int64_t chunk_bytes);
absl::Status CopyColumns(const Context& ctx, const Tensor& src, int64_t src_col, Tensor* dst, int64_t dst_col,
                         int64_t cols);
absl::Status BiasDropoutAdd(const Context& ctx, const Tensor& h, const Tensor& bias, const Tensor& residual,
                            const ResidualDropout& dropout, Tensor* out);
absl::Status DropoutScale(const Context& ctx, const ResidualDropout& dropout, Tensor* x);

// kernels/l2_norm.h (a row-wise op, so it lives with the element-wise kernels).
absl::StatusOr<L2NormForwardOutputs> L2NormalizationForward(const Context& ctx, const Tensor& x, float eps);
absl::StatusOr<Tensor> L2NormalizationBackward(const Context& ctx, const Tensor& dy, const Tensor& x,
                                               const Tensor& rsigma);

}  // namespace cuda
}  // namespace kernels
}  // namespace teserve

#endif  // TESERVE_KERNELS_CUDA_ELEMENTWISE_ELEMENTWISE_CUDA_H_
