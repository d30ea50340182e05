// GEMM operands made from quantized tensors, shared by the CPU and GPU GEMM tests: one
// copy of a QuantizedTensor with the scale mode its quantization implies, and the
// quantizations those tests start from (both copies, on the CPU).
#ifndef TESERVE_TESTS_KERNELS_QUANTIZED_OPERANDS_H_
#define TESERVE_TESTS_KERNELS_QUANTIZED_OPERANDS_H_

#include "core/quantized_tensor.h"
#include "core/tensor.h"
#include "kernels/block_quantize.h"
#include "kernels/gemm.h"
#include "kernels/nvfp4.h"

namespace teserve {
namespace testing_kernels {

// The GEMM scale mode of a quantization's mode.
inline kernels::GemmScaleMode GemmModeOf(ScalingMode mode) {
  switch (mode) {
    case ScalingMode::kPerTensor: return kernels::GemmScaleMode::kPerTensor;
    case ScalingMode::kBlock1D: return kernels::GemmScaleMode::kBlock1D;
    case ScalingMode::kBlock2D: return kernels::GemmScaleMode::kBlock2D;
    case ScalingMode::kMxfp8_1D: return kernels::GemmScaleMode::kMxfp8;
    case ScalingMode::kNvfp4_1D: return kernels::GemmScaleMode::kNvfp4_1D;
    case ScalingMode::kNvfp4_2D: return kernels::GemmScaleMode::kNvfp4_2D;
  }
  return kernels::GemmScaleMode::kPerTensor;
}

// One copy of q as a GEMM operand, its scales as the quantizer made them.
inline kernels::GemmOperand OperandOf(const QuantizedTensor& q, kernels::Copy copy, bool transpose) {
  const bool rowwise = copy == kernels::Copy::kRowwise;
  kernels::GemmOperand o{rowwise ? q.rowwise_data : q.columnwise_data, transpose,
                         rowwise ? q.rowwise_scale_inv : q.columnwise_scale_inv};
  o.scale_mode = GemmModeOf(q.mode);
  return o;
}

inline QuantizedTensor QuantizeMxfp8Copies(const Tensor& x, DType format = DType::kFloat8E4M3) {
  kernels::Mxfp8QuantizeOptions options;
  options.format = format;
  options.rowwise = true;
  options.columnwise = true;
  return kernels::QuantizeMxfp8(Context::Cpu(), x, options).value();
}

inline QuantizedTensor QuantizeNvfp4Copies(const Tensor& x, bool two_d) {
  kernels::Nvfp4QuantizeOptions options;
  options.rowwise = true;
  options.columnwise = true;
  options.two_d = two_d;
  return kernels::QuantizeNvfp4(Context::Cpu(), x, options).value();
}

}  // namespace testing_kernels
}  // namespace teserve

#endif  // TESERVE_TESTS_KERNELS_QUANTIZED_OPERANDS_H_
