// FP8 health statistics (what TE's LogFp8TensorStats reports), measured while
// quantizing by comparing the source with its dequantized copy:
//   underflow_ratio  non-zero source values that became zero
//   overflow_ratio   |x| > fp8_max * scale_inv (delayed scaling, where a stale scale can
//                    clip); 0 for recipes whose scale comes from the tensor itself
//   mse              mean squared quantization error
//   dynamic_range    log2(amax) - log2(smallest non-zero |x|), in binades
// and, for block formats, the min / max / mean of the decoded block scale_inv.
#ifndef TESERVE_RECIPES_HEALTH_H_
#define TESERVE_RECIPES_HEALTH_H_

#include "core/quantized_tensor.h"
#include "core/tensor.h"

namespace teserve {
namespace recipes {

struct HealthStats {
  bool valid = false;
  double underflow_ratio = 0.0;
  double overflow_ratio = 0.0;
  double mse = 0.0;
  double dynamic_range = 0.0;
};

struct BlockScaleSummary {
  bool valid = false;
  double min = 0.0;
  double max = 0.0;
  double mean = 0.0;
};

// x and dequantized: FP32, same shape. overflow_limit 0 disables the overflow count.
HealthStats MeasureHealth(const Tensor& x, const Tensor& dequantized, float overflow_limit);

// Summary of the block scales of q's rowwise copy (else its columnwise copy); invalid
// for per-tensor scaling.
BlockScaleSummary SummarizeBlockScales(const QuantizedTensor& q);

}  // namespace recipes
}  // namespace teserve

#endif  // TESERVE_RECIPES_HEALTH_H_
