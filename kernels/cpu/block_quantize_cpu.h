// CPU reference for kernels/block_quantize.h: MXFP8 and FP8 block-scaling
// quantization, their dequantization and the cuBLASLt scale layouts.
//
// These functions are the numerical oracle the CUDA kernels are tested against. They
// assume the metadata checks of kernels/block_quantize.cc have passed (FP32 rank-2
// source, FP8 format, divisible dims, CPU tensors of the expected shapes); call the
// kernels:: entry points for checked use.
#ifndef TESERVE_KERNELS_CPU_BLOCK_QUANTIZE_CPU_H_
#define TESERVE_KERNELS_CPU_BLOCK_QUANTIZE_CPU_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "core/context.h"
#include "core/quantized_tensor.h"
#include "core/tensor.h"
#include "kernels/block_quantize.h"

namespace teserve {
namespace kernels {
namespace cpu {

// The per-block scale of FP8 block scaling (the formula of kernels/block_quantize.h),
// exposed so the CUDA kernels' tests can check single values.
float BlockScalingScale(float block_amax, float fp8_max, bool power_2_scale, float amax_epsilon);

absl::StatusOr<QuantizedTensor> QuantizeMxfp8(const Context& ctx, const Tensor& x,
                                              const Mxfp8QuantizeOptions& options);

absl::StatusOr<QuantizedTensor> QuantizeBlockScaling(const Context& ctx, const Tensor& x,
                                                     const BlockScalingQuantizeOptions& options);

absl::StatusOr<Tensor> DequantizeBlock(const Context& ctx, const QuantizedTensor& q, Copy copy);

absl::StatusOr<Tensor> SwizzleMxfp8Scales(const Context& ctx, const Tensor& scales);

absl::StatusOr<Tensor> UnswizzleMxfp8Scales(const Context& ctx, const Tensor& swizzled,
                                            int64_t rows, int64_t cols);

absl::StatusOr<Tensor> BlockScalesGemmLayout(const Context& ctx, const Tensor& scale_inv,
                                             bool two_d);

}  // namespace cpu
}  // namespace kernels
}  // namespace teserve

#endif  // TESERVE_KERNELS_CPU_BLOCK_QUANTIZE_CPU_H_
