// CUDA implementations of kernels/nvfp4.h (NVFP4 quantization with 1D or 2D blocks,
// RHT on the columnwise copy, stochastic rounding; dequantization; unscaled E2M1
// casts) and of the random Hadamard transform of kernels/hadamard.h.
//
// Tensors must live on a CUDA device (the dispatchers in kernels/nvfp4.cc and
// kernels/hadamard.cc call these only then); work runs on ctx.stream. Quantization
// synchronizes once, between its amax pass and its quantize pass, because the global
// encode scale is a host value of the result; the other ops leave their device outputs
// for later work on the same stream. Results are bit-identical to kernels/cpu/nvfp4_cpu.h
// (and the CPU transform in kernels/hadamard.cc) on the same FP32 input and ctx.seed; a
// BF16 x is accepted by QuantizeNvfp4 and gives the bits of its exact FP32 widening.
#ifndef TESERVE_KERNELS_CUDA_NVFP4_CUDA_H_
#define TESERVE_KERNELS_CUDA_NVFP4_CUDA_H_

#include "absl/status/statusor.h"
#include "core/context.h"
#include "core/quantized_tensor.h"
#include "core/tensor.h"
#include "kernels/nvfp4.h"

namespace teserve {
namespace kernels {
namespace cuda {

absl::StatusOr<QuantizedTensor> QuantizeNvfp4(const Context& ctx, const Tensor& x,
                                              const Nvfp4QuantizeOptions& options);

// q's metadata must already be checked (kernels::DequantizeNvfp4 does).
absl::StatusOr<Tensor> DequantizeNvfp4(const Context& ctx, const QuantizedTensor& q, Copy copy, DType out_dtype);

absl::StatusOr<Tensor> CastToFloat4E2M1(const Context& ctx, const Tensor& x);
absl::StatusOr<Tensor> Float4E2M1ToFloat32(const Context& ctx, const Tensor& packed);

// x FP32 [rows, cols] with cols % 16 == 0; `inverse` applies M^T instead of M.
absl::StatusOr<Tensor> ApplyHadamard16(const Context& ctx, const Tensor& x, bool inverse);

}  // namespace cuda
}  // namespace kernels
}  // namespace teserve

#endif  // TESERVE_KERNELS_CUDA_NVFP4_CUDA_H_
