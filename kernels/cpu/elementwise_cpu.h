// CPU reference of kernels/elementwise.h (checks done by kernels/elementwise.cc).
#ifndef TESERVE_KERNELS_CPU_ELEMENTWISE_CPU_H_
#define TESERVE_KERNELS_CPU_ELEMENTWISE_CPU_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/context.h"
#include "core/tensor.h"
#include "kernels/dropout_math.h"

namespace teserve {
namespace kernels {
namespace cpu {

absl::Status AddInto(const Context& ctx, const Tensor& x, Tensor* into);
absl::Status Scale(const Context& ctx, float factor, Tensor* x);
absl::StatusOr<double> SumOfSquares(const Context& ctx, absl::Span<const Tensor> tensors);
absl::Status FillZero(const Context& ctx, Tensor* x);
absl::Status CopyInto(const Context& ctx, const Tensor& src, Tensor* dst);
absl::Status CopyColumns(const Context& ctx, const Tensor& src, int64_t src_col, Tensor* dst, int64_t dst_col,
                         int64_t cols);
absl::Status BiasDropoutAdd(const Context& ctx, const Tensor& h, const Tensor& bias, const Tensor& residual,
                            const ResidualDropout& dropout, Tensor* out);
absl::Status DropoutScale(const Context& ctx, const ResidualDropout& dropout, Tensor* x);

}  // namespace cpu
}  // namespace kernels
}  // namespace teserve

#endif  // TESERVE_KERNELS_CPU_ELEMENTWISE_CPU_H_
