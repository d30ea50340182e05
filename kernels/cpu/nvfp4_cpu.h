// CPU reference for kernels/nvfp4.h: NVFP4 quantization (1D and 2D blocks, optional
// random Hadamard transform of the columnwise copy, RNE or stochastic rounding),
// dequantization and unscaled packed-FP4 conversions.
//
// These functions are the numerical oracle the CUDA kernels will be held to bit for
// bit. They assume the metadata checks of kernels/nvfp4.cc have passed (FP32 rank-2
// source with the blocked dimensions divisible by 16, consistent QuantizedTensor
// metadata, CPU tensors); call the kernels:: entry points for checked use.
#ifndef TESERVE_KERNELS_CPU_NVFP4_CPU_H_
#define TESERVE_KERNELS_CPU_NVFP4_CPU_H_

#include "absl/status/statusor.h"
#include "core/context.h"
#include "core/quantized_tensor.h"
#include "core/tensor.h"
#include "kernels/nvfp4.h"

namespace teserve {
namespace kernels {
namespace cpu {

absl::StatusOr<QuantizedTensor> QuantizeNvfp4(const Context& ctx, const Tensor& x,
                                              const Nvfp4QuantizeOptions& options);

absl::StatusOr<Tensor> DequantizeNvfp4(const Context& ctx, const QuantizedTensor& q, Copy copy);

absl::StatusOr<Tensor> CastToFloat4E2M1(const Context& ctx, const Tensor& x);

absl::StatusOr<Tensor> Float4E2M1ToFloat32(const Context& ctx, const Tensor& packed);

}  // namespace cpu
}  // namespace kernels
}  // namespace teserve

#endif  // TESERVE_KERNELS_CPU_NVFP4_CPU_H_
