// CPU reference losses. Every sum and every intermediate is in double; only the
// outputs (loss, per-token loss, lse, gradients) are rounded to FP32, so the oracle is
// within an FP32 rounding of the formulas in kernels/loss.h.
// The backward recomputes softmax from the FP32 lse the forward saved (as a GPU
// backward would), not from a fresh double log-sum-exp.
#include "kernels/cpu/loss_cpu.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/status.h"
#include "kernels/loss_math.h"

namespace teserve {
namespace kernels {
namespace cpu {
namespace {

// Rows and classes of logits [..., V].
struct Rows {
  int64_t n;
  int64_t v;
};

Rows RowsOf(const Tensor& logits) {
  const int64_t v = logits.dim(-1);
  return {v == 0 ? 0 : logits.numel() / v, v};
}

}  // namespace

absl::StatusOr<MseForwardOutput> MseForward(const Tensor& y, const Tensor& target) {
  const float* a = y.data<float>();
  const float* b = target.data<float>();
  double sum = 0.0;
  for (int64_t k = 0; k < y.numel(); ++k) {
    const double d = static_cast<double>(a[k]) - b[k];
    sum += d * d;
  }
  MseForwardOutput out;
  out.num_elements = y.numel();
  out.loss = y.numel() == 0 ? 0.0f : static_cast<float>(sum / static_cast<double>(y.numel()));
  return out;
}

absl::StatusOr<Tensor> MseBackward(const Tensor& y, const Tensor& target, float grad_loss) {
  ASSIGN_OR_RETURN(Tensor dy, Tensor::Zeros(DType::kFloat32, y.shape()));
  const float* a = y.data<float>();
  const float* b = target.data<float>();
  float* out = dy.data<float>();
  const double scale = y.numel() == 0 ? 0.0 : 2.0 * grad_loss / static_cast<double>(y.numel());
  for (int64_t k = 0; k < y.numel(); ++k) out[k] = static_cast<float>(scale * (static_cast<double>(a[k]) - b[k]));
  return dy;
}

absl::StatusOr<CrossEntropyForwardOutput> CrossEntropyForward(const Tensor& logits, const Tensor& labels,
                                                              const CrossEntropyOptions& options) {
  const Rows rows = RowsOf(logits);
  CrossEntropyForwardOutput out;
  ASSIGN_OR_RETURN(out.per_token_loss, Tensor::Zeros(DType::kFloat32, labels.shape()));
  ASSIGN_OR_RETURN(out.lse, Tensor::Zeros(DType::kFloat32, {rows.n}));
  const double s = options.label_smoothing;
  double total = 0.0;
  for (int64_t r = 0; r < rows.n; ++r) {
    const float* x = logits.data<float>() + r * rows.v;
    double max = -std::numeric_limits<double>::infinity();
    for (int64_t j = 0; j < rows.v; ++j) max = std::max<double>(max, x[j]);
    double sum_exp = 0.0, sum_x = 0.0;
    for (int64_t j = 0; j < rows.v; ++j) {
      sum_exp += std::exp(static_cast<double>(x[j]) - max);
      sum_x += x[j];
    }
    const double lse = max + std::log(sum_exp);
    out.lse.data<float>()[r] = static_cast<float>(lse);
    const int64_t label = loss_math::LabelAt(labels, r);
    if (label == options.ignore_index) continue;
    const double loss = (1.0 - s) * (lse - x[label]) + s * (lse - sum_x / static_cast<double>(rows.v));
    out.per_token_loss.data<float>()[r] = static_cast<float>(loss);
    total += loss;
    ++out.num_valid;
  }
  out.loss = out.num_valid == 0 ? 0.0f : static_cast<float>(total / static_cast<double>(out.num_valid));
  return out;
}

absl::StatusOr<Tensor> CrossEntropyBackward(const Tensor& logits, const Tensor& labels, const Tensor& lse,
                                            int64_t num_valid, const CrossEntropyOptions& options,
                                            float grad_loss) {
  const Rows rows = RowsOf(logits);
  ASSIGN_OR_RETURN(Tensor dx, Tensor::Zeros(DType::kFloat32, logits.shape()));
  if (num_valid == 0) return dx;
  const double s = options.label_smoothing;
  const double uniform = s / static_cast<double>(rows.v);
  const double scale = static_cast<double>(grad_loss) / static_cast<double>(num_valid);
  for (int64_t r = 0; r < rows.n; ++r) {
    const int64_t label = loss_math::LabelAt(labels, r);
    if (label == options.ignore_index) continue;  // the row stays zero
    const float* x = logits.data<float>() + r * rows.v;
    float* g = dx.data<float>() + r * rows.v;
    const double row_lse = lse.data<float>()[r];
    for (int64_t j = 0; j < rows.v; ++j) {
      const double target = uniform + (j == label ? 1.0 - s : 0.0);
      g[j] = static_cast<float>(scale * (std::exp(static_cast<double>(x[j]) - row_lse) - target));
    }
  }
  return dx;
}

}  // namespace cpu
}  // namespace kernels
}  // namespace teserve
