// CPU reference LayerNorm / RMSNorm. Design choices:
// - One row at a time, every reduction and every intermediate in double; only the
//   outputs (y, mu, rsigma, dx, dgamma, dbeta) are rounded to FP32. The oracle is then
//   within an FP32 rounding of the exact formula, so GPU kernels are judged against
//   the mathematics, not against a second FP32 implementation.
// - The forward variance is two-pass (mean first, then mean of squared deviations),
//   which does not cancel for inputs with a large mean.
// - The backward pass uses the FP32 mu and rsigma the forward saved, as the GPU
//   backward will; it does not recompute them.
// - LayerNorm and RMSNorm share one row routine each way: RMSNorm is LayerNorm with
//   the mean fixed at 0 and no beta, and its dx has no mean(dyw) term.
//   With xhat = (x - mu) * rsigma and dyw = dy * w:
//     LayerNorm dx = rsigma * (dyw - mean(dyw) - xhat * mean(dyw * xhat))
//     RMSNorm   dx = rsigma * (dyw - xhat * mean(dyw * xhat))
//     dgamma = sum_rows(dy * xhat), dbeta = sum_rows(dy)
#include "kernels/cpu/normalization_cpu.h"

#include <cmath>
#include <vector>

#include "core/status.h"
#include "kernels/cpu/cast_cpu.h"

namespace teserve {
namespace kernels {
namespace cpu {
namespace {

enum class NormKind { kLayerNorm, kRmsNorm };

// w = gamma, or 1 + gamma with zero-centered gamma; in double.
std::vector<double> EffectiveWeight(const Tensor& gamma, bool zero_centered_gamma) {
  const float* g = gamma.data<float>();
  std::vector<double> w(gamma.numel());
  for (size_t j = 0; j < w.size(); ++j) w[j] = (zero_centered_gamma ? 1.0 : 0.0) + g[j];
  return w;
}

struct RowStats {
  double mean;
  double rsigma;
};

RowStats ComputeRowStats(NormKind kind, const float* x, int64_t h, double eps) {
  double mean = 0.0;
  if (kind == NormKind::kLayerNorm) {
    for (int64_t j = 0; j < h; ++j) mean += x[j];
    mean /= static_cast<double>(h);
  }
  double sq = 0.0;
  for (int64_t j = 0; j < h; ++j) {
    const double d = x[j] - mean;
    sq += d * d;
  }
  return {mean, 1.0 / std::sqrt(sq / static_cast<double>(h) + eps)};
}

// beta may be null (RMSNorm).
absl::StatusOr<NormForwardOutputs> NormForward(NormKind kind, const Tensor& x, const Tensor& gamma,
                                               const Tensor* beta, float eps,
                                               bool zero_centered_gamma) {
  const int64_t n = x.dim(0);
  const int64_t h = x.dim(1);
  NormForwardOutputs out;
  ASSIGN_OR_RETURN(out.y, Tensor::Zeros(DType::kFloat32, {n, h}));
  ASSIGN_OR_RETURN(out.rsigma, Tensor::Zeros(DType::kFloat32, {n}));
  if (kind == NormKind::kLayerNorm) {
    ASSIGN_OR_RETURN(out.mu, Tensor::Zeros(DType::kFloat32, {n}));
  }
  const std::vector<double> w = EffectiveWeight(gamma, zero_centered_gamma);
  const float* b = beta != nullptr ? beta->data<float>() : nullptr;
  for (int64_t i = 0; i < n; ++i) {
    const float* row = x.data<float>() + i * h;
    float* y = out.y.data<float>() + i * h;
    const RowStats stats = ComputeRowStats(kind, row, h, eps);
    for (int64_t j = 0; j < h; ++j) {
      const double shift = b != nullptr ? b[j] : 0.0;
      y[j] = static_cast<float>((row[j] - stats.mean) * stats.rsigma * w[j] + shift);
    }
    out.rsigma.data<float>()[i] = static_cast<float>(stats.rsigma);
    if (out.mu.defined()) out.mu.data<float>()[i] = static_cast<float>(stats.mean);
  }
  return out;
}

// One row of the backward pass: writes dx and adds to the double parameter sums.
void NormBackwardRow(NormKind kind, const float* dy, const float* x, RowStats stats,
                     const std::vector<double>& w, float* dx, std::vector<double>* dgamma,
                     std::vector<double>* dbeta) {
  const int64_t h = static_cast<int64_t>(w.size());
  std::vector<double> xhat(h);
  double mean_dyw = 0.0;
  double mean_dyw_xhat = 0.0;
  for (int64_t j = 0; j < h; ++j) {
    xhat[j] = (x[j] - stats.mean) * stats.rsigma;
    const double dyw = dy[j] * w[j];
    mean_dyw += dyw;
    mean_dyw_xhat += dyw * xhat[j];
    (*dgamma)[j] += dy[j] * xhat[j];
    (*dbeta)[j] += dy[j];
  }
  mean_dyw = kind == NormKind::kLayerNorm ? mean_dyw / static_cast<double>(h) : 0.0;
  mean_dyw_xhat /= static_cast<double>(h);
  for (int64_t j = 0; j < h; ++j) {
    const double dyw = dy[j] * w[j];
    dx[j] = static_cast<float>(stats.rsigma * (dyw - mean_dyw - xhat[j] * mean_dyw_xhat));
  }
}

absl::StatusOr<Tensor> ToFloatTensor(const std::vector<double>& values) {
  std::vector<float> rounded(values.begin(), values.end());
  return Tensor::FromFloats(rounded, {static_cast<int64_t>(values.size())});
}

// mu may be null (RMSNorm: the mean is 0).
absl::StatusOr<NormBackwardOutputs> NormBackward(NormKind kind, const Tensor& dy, const Tensor& x,
                                                 const Tensor* mu, const Tensor& rsigma,
                                                 const Tensor& gamma, bool zero_centered_gamma) {
  const int64_t n = x.dim(0);
  const int64_t h = x.dim(1);
  NormBackwardOutputs out;
  ASSIGN_OR_RETURN(out.dx, Tensor::Zeros(DType::kFloat32, {n, h}));
  const std::vector<double> w = EffectiveWeight(gamma, zero_centered_gamma);
  std::vector<double> dgamma(h, 0.0);
  std::vector<double> dbeta(h, 0.0);
  for (int64_t i = 0; i < n; ++i) {
    const RowStats stats{mu != nullptr ? mu->data<float>()[i] : 0.0, rsigma.data<float>()[i]};
    NormBackwardRow(kind, dy.data<float>() + i * h, x.data<float>() + i * h, stats, w,
                    out.dx.data<float>() + i * h, &dgamma, &dbeta);
  }
  ASSIGN_OR_RETURN(out.dgamma, ToFloatTensor(dgamma));
  if (kind == NormKind::kLayerNorm) {
    ASSIGN_OR_RETURN(out.dbeta, ToFloatTensor(dbeta));
  }
  return out;
}

}  // namespace

absl::StatusOr<NormForwardOutputs> LayerNormForward(const Context&, const Tensor& x,
                                                    const Tensor& gamma, const Tensor& beta,
                                                    float eps, bool zero_centered_gamma) {
  return NormForward(NormKind::kLayerNorm, x, gamma, &beta, eps, zero_centered_gamma);
}

absl::StatusOr<NormBackwardOutputs> LayerNormBackward(const Context&, const Tensor& dy,
                                                      const Tensor& x, const Tensor& mu,
                                                      const Tensor& rsigma, const Tensor& gamma,
                                                      bool zero_centered_gamma) {
  return NormBackward(NormKind::kLayerNorm, dy, x, &mu, rsigma, gamma, zero_centered_gamma);
}

absl::StatusOr<NormForwardOutputs> RmsNormForward(const Context&, const Tensor& x,
                                                  const Tensor& gamma, float eps,
                                                  bool zero_centered_gamma) {
  return NormForward(NormKind::kRmsNorm, x, gamma, nullptr, eps, zero_centered_gamma);
}

absl::StatusOr<NormBackwardOutputs> RmsNormBackward(const Context&, const Tensor& dy,
                                                    const Tensor& x, const Tensor& rsigma,
                                                    const Tensor& gamma, bool zero_centered_gamma) {
  return NormBackward(NormKind::kRmsNorm, dy, x, nullptr, rsigma, gamma, zero_centered_gamma);
}

namespace {

// x widened to FP32 (exact for FP16 and BF16); FP32 tensors are shared, not copied.
absl::StatusOr<Tensor> AsFloat32(const Context& ctx, const Tensor& x) {
  if (x.dtype() == DType::kFloat32) return x;
  return cpu::ToFloat32(ctx, x);
}

}  // namespace

absl::StatusOr<NormForwardResult> NormalizationForward(const Context& ctx, NormType type,
                                                       const Tensor& x, const Tensor& gamma,
                                                       const Tensor& beta,
                                                       const NormForwardOptions& options) {
  ASSIGN_OR_RETURN(const Tensor x32, AsFloat32(ctx, x));
  ASSIGN_OR_RETURN(NormForwardOutputs norm,
                   type == NormType::kLayerNorm
                       ? LayerNormForward(ctx, x32, gamma, beta, options.eps,
                                          options.zero_centered_gamma)
                       : RmsNormForward(ctx, x32, gamma, options.eps, options.zero_centered_gamma));
  NormForwardResult out;
  out.mu = std::move(norm.mu);
  out.rsigma = std::move(norm.rsigma);
  if (options.quantize) {
    ASSIGN_OR_RETURN(out.fp8, cpu::QuantizePerTensor(ctx, norm.y, options.quantize_options));
  }
  if (options.write_y) {
    const DType y_dtype = options.y_dtype.value_or(x.dtype());
    if (y_dtype == DType::kFloat32) {
      out.y = std::move(norm.y);
    } else {
      ASSIGN_OR_RETURN(out.y, cpu::CastFromFloat32(ctx, norm.y, y_dtype));
    }
  }
  return out;
}

absl::StatusOr<NormBackwardOutputs> NormalizationBackward(const Context& ctx, NormType type,
                                                          const Tensor& dy, const Tensor& x,
                                                          const Tensor& mu, const Tensor& rsigma,
                                                          const Tensor& gamma,
                                                          const NormBackwardOptions& options) {
  ASSIGN_OR_RETURN(const Tensor dy32, AsFloat32(ctx, dy));
  ASSIGN_OR_RETURN(const Tensor x32, AsFloat32(ctx, x));
  ASSIGN_OR_RETURN(NormBackwardOutputs out,
                   type == NormType::kLayerNorm
                       ? LayerNormBackward(ctx, dy32, x32, mu, rsigma, gamma,
                                           options.zero_centered_gamma)
                       : RmsNormBackward(ctx, dy32, x32, rsigma, gamma,
                                         options.zero_centered_gamma));
  if (x.dtype() != DType::kFloat32) {
    ASSIGN_OR_RETURN(out.dx, cpu::CastFromFloat32(ctx, out.dx, x.dtype()));
  }
  return out;
}

}  // namespace cpu
}  // namespace kernels
}  // namespace teserve
