// CUDA implementations of the cast family (contract: kernels/cast.h).
//
// Every function here requires its tensors to live on a CUDA device (the dispatcher in
// kernels/cast.cc calls them only then) and runs on ctx.stream (nullptr = the default
// stream). They synchronize the stream before returning a host value (Amax, the amax of
// QuantizePerTensor) so the result is ready; device outputs are allocated through the
// CUDA allocator registered with core (RegisterCudaAllocator). Results are bit-identical
// to kernels/cpu given the same inputs and scale.
#ifndef TESERVE_KERNELS_CUDA_CAST_CUDA_H_
#define TESERVE_KERNELS_CUDA_CAST_CUDA_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/context.h"
#include "core/quantized_tensor.h"
#include "core/tensor.h"
#include "kernels/cast.h"
#include "kernels/cuda/cuda_allocator.h"  // RegisterCudaAllocator, for callers

namespace teserve {
namespace kernels {
namespace cuda {

// max |x| over all elements (FP32 or BF16 x on a CUDA device); NaN if any is NaN.
absl::StatusOr<float> Amax(const Context& ctx, const Tensor& x);

// Fused per-tensor FP8 cast: one pass computes the amax, the rowwise copy and the
// columnwise (transposed) copy as requested, and with options.dbias (a CUDA FP32 [cols]
// tensor) the column sums of x. x is FP32 [rows, cols] (BF16 accepted too).
absl::StatusOr<QuantizedTensor> QuantizePerTensor(const Context& ctx, const Tensor& x,
                                                  const PerTensorQuantizeOptions& options);

// FP32 tensor q * scale_inv of the requested copy, on q's device.
absl::StatusOr<Tensor> Dequantize(const Context& ctx, const QuantizedTensor& q, Copy copy);

// Plain conversions on x's device, bit-identical to kernels/cpu (no scaling; FP8
// encodes saturate): FP32/FP16/BF16/E4M3/E5M2 -> FP32, and FP32 -> `dtype`.
absl::StatusOr<Tensor> ToFloat32(const Context& ctx, const Tensor& x);
absl::StatusOr<Tensor> CastFromFloat32(const Context& ctx, const Tensor& x, DType dtype);

// Host <-> device copies (synchronous on ctx.stream). CopyToDevice returns a new tensor
// on `device` (a CUDA device); CopyToHost returns a new CPU tensor.
absl::StatusOr<Tensor> CopyToDevice(const Context& ctx, const Tensor& host, Device device);
absl::StatusOr<Tensor> CopyToHost(const Context& ctx, const Tensor& device_tensor);

}  // namespace cuda
}  // namespace kernels
}  // namespace teserve

#endif  // TESERVE_KERNELS_CUDA_CAST_CUDA_H_
