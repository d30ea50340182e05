#include "kernels/timing.h"

namespace teserve {
namespace kernels {

absl::string_view KernelOpName(KernelOp op) {
  switch (op) {
    case KernelOp::kGemm: return "gemm";
    case KernelOp::kAmax: return "amax";
    case KernelOp::kQuantizePerTensor: return "quantize_per_tensor";
    case KernelOp::kDequantizePerTensor: return "dequantize_per_tensor";
    case KernelOp::kQuantizeMxfp8: return "quantize_mxfp8";
    case KernelOp::kQuantizeBlock: return "quantize_block";
    case KernelOp::kDequantizeBlock: return "dequantize_block";
    case KernelOp::kQuantizeNvfp4: return "quantize_nvfp4";
    case KernelOp::kDequantizeNvfp4: return "dequantize_nvfp4";
    case KernelOp::kLayerNormForward: return "layernorm_forward";
    case KernelOp::kLayerNormBackward: return "layernorm_backward";
    case KernelOp::kRmsNormForward: return "rmsnorm_forward";
    case KernelOp::kRmsNormBackward: return "rmsnorm_backward";
    case KernelOp::kNormalizationForward: return "normalization_forward";
    case KernelOp::kNormalizationBackward: return "normalization_backward";
    case KernelOp::kActivationForward: return "activation_forward";
    case KernelOp::kActivationBackward: return "activation_backward";
    case KernelOp::kAttentionForward: return "attention_forward";
    case KernelOp::kAttentionBackward: return "attention_backward";
    case KernelOp::kRopeForward: return "rope_forward";
    case KernelOp::kRopeBackward: return "rope_backward";
    case KernelOp::kMseForward: return "mse_forward";
    case KernelOp::kMseBackward: return "mse_backward";
    case KernelOp::kCrossEntropyForward: return "cross_entropy_forward";
    case KernelOp::kCrossEntropyBackward: return "cross_entropy_backward";
  }
  return "unknown";
}

}  // namespace kernels
}  // namespace teserve
