#include "recipes/health.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/float_codec.h"

namespace teserve {
namespace recipes {

HealthStats MeasureHealth(const Tensor& x, const Tensor& dequantized, float overflow_limit) {
  HealthStats stats;
  absl::Span<const float> src = x.floats();
  absl::Span<const float> deq = dequantized.floats();
  if (src.empty() || src.size() != deq.size()) return stats;
  int64_t nonzero = 0, underflow = 0, overflow = 0;
  double squared_error = 0.0;
  float amax = 0.0f, min_nonzero = std::numeric_limits<float>::infinity();
  for (size_t i = 0; i < src.size(); ++i) {
    const float a = std::fabs(src[i]);
    if (a != 0.0f) {
      ++nonzero;
      if (deq[i] == 0.0f) ++underflow;
      min_nonzero = std::min(min_nonzero, a);
    }
    if (overflow_limit > 0.0f && a > overflow_limit) ++overflow;
    amax = std::max(amax, a);
    const double e = static_cast<double>(src[i]) - deq[i];
    squared_error += e * e;
  }
  stats.valid = true;
  stats.underflow_ratio = nonzero > 0 ? static_cast<double>(underflow) / nonzero : 0.0;
  stats.overflow_ratio = static_cast<double>(overflow) / src.size();
  stats.mse = squared_error / src.size();
  stats.dynamic_range = nonzero > 0 && std::isfinite(amax) ? std::log2(amax) - std::log2(min_nonzero) : 0.0;
  return stats;
}

namespace {

double DecodeScale(const Tensor& scales, int64_t i, float global_decode) {
  switch (scales.dtype()) {
    case DType::kFloat8E8M0: return E8M0ToFloat(scales.data<uint8_t>()[i]);
    case DType::kFloat8E4M3: return static_cast<double>(E4M3ToFloat(scales.data<uint8_t>()[i])) * global_decode;
    default: return scales.data<float>()[i];
  }
}

}  // namespace

BlockScaleSummary SummarizeBlockScales(const QuantizedTensor& q) {
  BlockScaleSummary summary;
  if (q.mode == ScalingMode::kPerTensor) return summary;
  const Tensor& scales = q.rowwise_scale_inv.defined() ? q.rowwise_scale_inv : q.columnwise_scale_inv;
  if (!scales.defined() || scales.numel() == 0) return summary;
  const float global_decode = 1.0f / q.global_encode_scale;
  summary.valid = true;
  summary.min = std::numeric_limits<double>::infinity();
  summary.max = -std::numeric_limits<double>::infinity();
  double sum = 0.0;
  for (int64_t i = 0; i < scales.numel(); ++i) {
    const double s = DecodeScale(scales, i, global_decode);
    summary.min = std::min(summary.min, s);
    summary.max = std::max(summary.max, s);
    sum += s;
  }
  summary.mean = sum / scales.numel();
  return summary;
}

}  // namespace recipes
}  // namespace teserve
