// CPU reference for kernels/cast.h: amax, per-tensor FP8 quantization (rowwise and
// transposed columnwise copies), dequantization and plain dtype conversions.
//
// These functions are the numerical oracle the CUDA kernels are tested against. They
// assume the metadata checks of kernels/cast.cc have passed (FP32 rank-2 source,
// supported formats, CPU tensors); call the kernels:: entry points for checked use.
#ifndef TESERVE_KERNELS_CPU_CAST_CPU_H_
#define TESERVE_KERNELS_CPU_CAST_CPU_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "core/context.h"
#include "core/quantized_tensor.h"
#include "core/tensor.h"
#include "kernels/cast.h"

namespace teserve {
namespace kernels {
namespace cpu {

absl::StatusOr<float> Amax(const Context& ctx, const Tensor& x);

absl::StatusOr<QuantizedTensor> QuantizePerTensor(const Context& ctx, const Tensor& x,
                                                  const PerTensorQuantizeOptions& options);

absl::StatusOr<Tensor> Dequantize(const Context& ctx, const QuantizedTensor& q, Copy copy);

// dbias[c] = sum_r x[r, c] over x FP32 [rows, cols] row-major, accumulated in FP64 in
// one pass over x and rounded once to FP32 (the fused-dbias reference of kernels/cast.h
// and kernels/block_quantize.h). NaN and Inf propagate; rows == 0 gives zeros.
void ColumnSums(const float* x, int64_t rows, int64_t cols, float* dbias);

absl::StatusOr<Tensor> ToFloat32(const Context& ctx, const Tensor& x);

absl::StatusOr<Tensor> CastFromFloat32(const Context& ctx, const Tensor& x, DType dtype);

}  // namespace cpu
}  // namespace kernels
}  // namespace teserve

#endif  // TESERVE_KERNELS_CPU_CAST_CPU_H_
