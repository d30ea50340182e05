// QuantizedTensor: a high-precision 2-D tensor [rows, cols] in a narrow format.
// Meaning: q = cast(x * scale) and x ~= q * scale_inv, per tensor or per block.
//
// The rowwise copy is laid out like the source ([rows, cols]); the columnwise copy is
// its transpose ([cols, rows]) so the TN-only FP8 GEMMs can read either operand along
// its reduction dimension (fprop/dgrad/wgrad: docs/te_facts.md, "GEMMs"). Either copy
// may be absent when no GEMM needs it.
#ifndef TESERVE_CORE_QUANTIZED_TENSOR_H_
#define TESERVE_CORE_QUANTIZED_TENSOR_H_

#include "absl/strings/string_view.h"
#include "core/tensor.h"

namespace teserve {

enum class ScalingMode {
  kPerTensor,  // one FP32 scale_inv for the whole tensor (delayed / current scaling)
  kMxfp8_1D,   // E8M0 scale per 1x32 (rowwise) / 32x1 (columnwise) block
  kBlock1D,    // FP32 scale per 1x128 block
  kBlock2D,    // FP32 scale per 128x128 block
  kNvfp4_1D,   // E4M3 scale per 16 elements + FP32 per-tensor scale
  kNvfp4_2D,   // E4M3 scale per 16x16 block + FP32 per-tensor scale
};

absl::string_view ScalingModeName(ScalingMode mode);

struct QuantizedTensor {
  Shape shape;  // logical [rows, cols] of the source
  DType format = DType::kFloat8E4M3;
  ScalingMode mode = ScalingMode::kPerTensor;
  Tensor rowwise_data;           // [rows, cols], absent if not requested
  Tensor rowwise_scale_inv;      // FP32 [1] for per-tensor scaling
  Tensor columnwise_data;        // [cols, rows], absent if not requested
  Tensor columnwise_scale_inv;   // FP32 [1] for per-tensor scaling
  float amax = 0.0f;             // of the source tensor (see amax_bits)
  // Set instead of amax when the quantization left its amax on the device
  // (PerTensorQuantizeOptions::defer_amax on CUDA): INT32 [1] holding the FP32 bits of
  // the amax, ordered on the stream that quantized; amax is 0 until a caller reads it.
  Tensor amax_bits;
  // NVFP4 only: the FP32 per-tensor encode scale S = 448 * 6 / amax (1 when amax is 0);
  // a value decodes as e2m1 * e4m3_block_scale * (1 / S).
  float global_encode_scale = 1.0f;

  bool has_rowwise() const { return rowwise_data.defined(); }
  bool has_columnwise() const { return columnwise_data.defined(); }
  int64_t rows() const { return shape.size() == 2 ? shape[0] : 0; }
  int64_t cols() const { return shape.size() == 2 ? shape[1] : 0; }
};

}  // namespace teserve

#endif  // TESERVE_CORE_QUANTIZED_TENSOR_H_
