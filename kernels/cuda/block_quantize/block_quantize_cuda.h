// CUDA implementations of kernels/block_quantize.h: MXFP8 and FP8 block-scaling
// quantization (amax, rowwise and transposed columnwise copies in one pass),
// dequantization and the cuBLASLt scale layouts.
//
// Tensors must live on a CUDA device (kernels/block_quantize.cc calls these only then);
// work runs on ctx.stream (nullptr = the default stream). Quantization synchronizes the
// stream to return q.amax; the other ops leave their device outputs for later work on
// the same stream. Outputs are allocated on the source's device. Results are
// bit-identical to kernels/cpu/block_quantize_cpu.h on the same FP32 input; a BF16 x is
// accepted too and gives the bits the CPU gives for its exact FP32 widening.
#ifndef TESERVE_KERNELS_CUDA_BLOCK_QUANTIZE_CUDA_H_
#define TESERVE_KERNELS_CUDA_BLOCK_QUANTIZE_CUDA_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "core/context.h"
#include "core/quantized_tensor.h"
#include "core/tensor.h"
#include "kernels/block_quantize.h"
#include "kernels/cuda/block_quantize/block_quantize_kernels.h"

namespace teserve {
namespace kernels {
namespace cuda {

// `encoder` picks the FP8 conversion (same bits either way; kSoftware exists for tests
// and benchmarks).
absl::StatusOr<QuantizedTensor> QuantizeMxfp8(const Context& ctx, const Tensor& x,
                                              const Mxfp8QuantizeOptions& options,
                                              Fp8Encoder encoder = Fp8Encoder::kHardware);

absl::StatusOr<QuantizedTensor> QuantizeBlockScaling(const Context& ctx, const Tensor& x,
                                                     const BlockScalingQuantizeOptions& options,
                                                     Fp8Encoder encoder = Fp8Encoder::kHardware);

// q's metadata must already be checked (kernels::DequantizeBlock does).
absl::StatusOr<Tensor> DequantizeBlock(const Context& ctx, const QuantizedTensor& q, Copy copy, DType out_dtype);

absl::StatusOr<Tensor> SwizzleMxfp8Scales(const Context& ctx, const Tensor& scales);

absl::StatusOr<Tensor> UnswizzleMxfp8Scales(const Context& ctx, const Tensor& swizzled,
                                            int64_t rows, int64_t cols);

absl::StatusOr<Tensor> BlockScalesGemmLayout(const Context& ctx, const Tensor& scale_inv,
                                             bool two_d);

}  // namespace cuda
}  // namespace kernels
}  // namespace teserve

#endif  // TESERVE_KERNELS_CUDA_BLOCK_QUANTIZE_CUDA_H_
