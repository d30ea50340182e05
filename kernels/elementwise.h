// Element-wise glue of the layers and the training step, on FP32 tensors of the Context's
// device (FillZero and the copies take any dtype):
//   AddInto:        into += x (same shape): gradient accumulation, residual adds.
//   Scale:          x *= factor, in place: gradient clipping.
//   SumOfSquares:   sum over every tensor of sum x^2, accumulated in double and returned
//                   to the host (the global gradient norm is read by Step).
//   FillZero:       every byte of x becomes 0: ZeroGrad.
//   CopyInto / CopyTo: bytes between tensors of any devices (the RPC edge: inputs to
//                   the session's device, results back). Ordered on ctx.stream; a copy
//                   that reads or writes host memory is complete when it returns.
//   CopyManyInto / CopyManyTo: the same for many tensors at once (session checkpoints:
//                   snapshots to the host, restores to the device). On CUDA the
//                   host <-> device copies go through one pinned staging buffer of at
//                   most kCopyManyChunkBytes, enqueued on ctx.stream chunk by chunk with
//                   one wait per chunk instead of one per tensor; device-to-host
//                   chunks are first packed on the device (a gather kernel for the small
//                   tensors, device copies for the large) and cross in one copy.
//   CopyColumns:    dst[:, dst_col + j] = src[:, src_col + j] for j < cols, rank-2
//                   tensors of one dtype (any) with the same row count on ctx's device:
//                   attention's head split and merge of fused projections.
//   BiasDropoutAdd: out[i] = residual[i] + factor(i) * (h[i] + bias[i % hidden]), with
//                   factor from kernels/dropout_math.h (no multiply when nothing is
//                   dropped) and bias optional ([hidden]; h + 0 when undefined); each
//                   operation one FP32 rounding in that order, so the CPU and CUDA
//                   results and masks agree bit for bit. TransformerLayer's residuals.
//   DropoutScale:   x[i] *= factor(i) in place: BiasDropoutAdd's backward for h.
// The CPU versions are the reference. SumOfSquares on CUDA adds per-block partial sums
// (double) in a fixed order, so its result is deterministic but may differ from the
// CPU's in the last bits (a different summation order).
#ifndef TESERVE_KERNELS_ELEMENTWISE_H_
#define TESERVE_KERNELS_ELEMENTWISE_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/context.h"
#include "core/tensor.h"
#include "kernels/dropout_math.h"

namespace teserve {
namespace kernels {

absl::Status AddInto(const Context& ctx, const Tensor& x, Tensor* into);

absl::Status Scale(const Context& ctx, float factor, Tensor* x);

absl::StatusOr<double> SumOfSquares(const Context& ctx, absl::Span<const Tensor> tensors);

absl::Status CopyColumns(const Context& ctx, const Tensor& src, int64_t src_col, Tensor* dst, int64_t dst_col,
                         int64_t cols);

absl::StatusOr<Tensor> BiasDropoutAdd(const Context& ctx, const Tensor& h, const Tensor& bias, const Tensor& residual,
                                      const ResidualDropout& dropout);

absl::Status DropoutScale(const Context& ctx, const ResidualDropout& dropout, Tensor* x);

absl::Status FillZero(const Context& ctx, Tensor* x);

// dst's bytes become src's: same dtype and shape, any devices.
absl::Status CopyInto(const Context& ctx, const Tensor& src, Tensor* dst);

// A copy of t on `device` (t itself when it is there already: tensors share buffers).
absl::StatusOr<Tensor> CopyTo(const Context& ctx, const Tensor& t, Device device);

// The pinned staging buffer of CopyManyInto / CopyManyTo on CUDA: a call allocates one
// of min(chunk_bytes, the bytes it moves between host and device) and reuses it chunk
// by chunk (a tensor larger than the room left is split across chunks). chunk_bytes must
// be > 0; tests pass small values to exercise the splitting.
inline constexpr int64_t kCopyManyChunkBytes = int64_t{64} << 20;

// CopyInto for every pair: dsts[i]'s bytes become srcs[i]'s (same dtype and shape; any
// devices, but the non-CPU tensors all on one device). No dst may be a src of another
// pair. Ordered on ctx.stream; every copy that reads or writes host memory is complete
// when it returns (device-to-device copies are only enqueued, as CopyInto's). On an
// error, dsts may be partly written.
absl::Status CopyManyInto(const Context& ctx, absl::Span<const Tensor* const> srcs, absl::Span<Tensor* const> dsts,
                          int64_t chunk_bytes = kCopyManyChunkBytes);

// New copies of `tensors` on `device`, in order: each a tensor of its own (never t itself,
// unlike CopyTo), copied as CopyManyInto copies. Empty tensors are fine.
absl::StatusOr<std::vector<Tensor>> CopyManyTo(const Context& ctx, absl::Span<const Tensor* const> tensors,
                                               Device device, int64_t chunk_bytes = kCopyManyChunkBytes);

}  // namespace kernels
}  // namespace teserve

#endif  // TESERVE_KERNELS_ELEMENTWISE_H_
