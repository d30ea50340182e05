// Double-precision references for the normalization tests, written from the formulas
// in kernels/normalization.h and independent of kernels/cpu:
//   - the forward pass, directly;
//   - the backward pass through the explicit Jacobian of xhat,
//       d xhat_k / d x_j = rsigma * (delta_kj - c / h - xhat_k * xhat_j / h),
//     with c = 1 for LayerNorm and 0 for RMSNorm, so dx_j = sum_k dy_k w_k d xhat_k/d x_j;
//   - central finite differences of the loss sum(dy * y) on the forward formula.
// Each reference also returns the magnitude of the terms it summed, the scale the
// shared tolerance table's rtol applies to (tests/kernels/tolerances.h).
#ifndef TESERVE_TESTS_KERNELS_NORM_REFERENCE_H_
#define TESERVE_TESTS_KERNELS_NORM_REFERENCE_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace teserve {
namespace testing_kernels {

enum class Norm { kLayerNorm, kRmsNorm };

struct NormProblem {
  Norm norm;
  int64_t n, h;
  bool zero_centered;
  double eps;
  std::vector<double> x, gamma, beta, dy;  // beta unused for RMSNorm

  double Weight(int64_t j) const { return gamma[j] + (zero_centered ? 1.0 : 0.0); }
  double Beta(int64_t j) const { return norm == Norm::kLayerNorm ? beta[j] : 0.0; }
};

struct RefStats {
  double mean;
  double rsigma;
};

inline RefStats StatsOf(const NormProblem& p, const double* x) {
  double mean = 0.0;
  if (p.norm == Norm::kLayerNorm) {
    for (int64_t j = 0; j < p.h; ++j) mean += x[j];
    mean /= p.h;
  }
  double var = 0.0;
  for (int64_t j = 0; j < p.h; ++j) var += (x[j] - mean) * (x[j] - mean);
  return {mean, 1.0 / std::sqrt(var / p.h + p.eps)};
}

// sum_j dy_j * y_j for row i with the row's x replaced by `x`.
inline double RowLoss(const NormProblem& p, int64_t i, const double* x) {
  const RefStats s = StatsOf(p, x);
  double loss = 0.0;
  for (int64_t j = 0; j < p.h; ++j) {
    loss += p.dy[i * p.h + j] * ((x[j] - s.mean) * s.rsigma * p.Weight(j) + p.Beta(j));
  }
  return loss;
}

struct Reference {
  std::vector<double> value;
  std::vector<double> magnitude;
};

inline Reference ForwardY(const NormProblem& p) {
  Reference r{std::vector<double>(p.n * p.h), std::vector<double>(p.n * p.h)};
  for (int64_t i = 0; i < p.n; ++i) {
    const RefStats s = StatsOf(p, &p.x[i * p.h]);
    for (int64_t j = 0; j < p.h; ++j) {
      const double scaled = (p.x[i * p.h + j] - s.mean) * s.rsigma * p.Weight(j);
      r.value[i * p.h + j] = scaled + p.Beta(j);
      r.magnitude[i * p.h + j] = std::fabs(scaled) + std::fabs(p.Beta(j));
    }
  }
  return r;
}

inline Reference JacobianDx(const NormProblem& p) {
  Reference r{std::vector<double>(p.n * p.h, 0.0), std::vector<double>(p.n * p.h, 0.0)};
  const double c = p.norm == Norm::kLayerNorm ? 1.0 : 0.0;
  std::vector<double> xhat(p.h);
  for (int64_t i = 0; i < p.n; ++i) {
    const RefStats s = StatsOf(p, &p.x[i * p.h]);
    for (int64_t k = 0; k < p.h; ++k) xhat[k] = (p.x[i * p.h + k] - s.mean) * s.rsigma;
    for (int64_t j = 0; j < p.h; ++j) {
      double sum = 0.0, mag = 0.0;
      for (int64_t k = 0; k < p.h; ++k) {
        const double dyw = p.dy[i * p.h + k] * p.Weight(k);
        const double jac = s.rsigma * ((k == j ? 1.0 : 0.0) - c / p.h - xhat[k] * xhat[j] / p.h);
        sum += dyw * jac;
        mag += std::fabs(dyw) * s.rsigma * ((k == j ? 1.0 : 0.0) + c / p.h + std::fabs(xhat[k] * xhat[j]) / p.h);
      }
      r.value[i * p.h + j] = sum;
      r.magnitude[i * p.h + j] = mag;
    }
  }
  return r;
}

// Central differences of RowLoss in every x; step relative to |x|.
inline std::vector<double> FiniteDifferenceDx(const NormProblem& p) {
  std::vector<double> dx(p.n * p.h);
  std::vector<double> row(p.h);
  for (int64_t i = 0; i < p.n; ++i) {
    for (int64_t j = 0; j < p.h; ++j) {
      row.assign(p.x.begin() + i * p.h, p.x.begin() + (i + 1) * p.h);
      const double step = 1e-4 * std::max(1.0, std::fabs(row[j]));
      row[j] = p.x[i * p.h + j] + step;
      const double up = RowLoss(p, i, row.data());
      row[j] = p.x[i * p.h + j] - step;
      const double down = RowLoss(p, i, row.data());
      dx[i * p.h + j] = (up - down) / (2 * step);
    }
  }
  return dx;
}

// dgamma_j = sum_i dy_ij xhat_ij and dbeta_j = sum_i dy_ij, with magnitudes.
inline void ParameterGradients(const NormProblem& p, Reference* dgamma, Reference* dbeta) {
  *dgamma = Reference{std::vector<double>(p.h, 0.0), std::vector<double>(p.h, 0.0)};
  *dbeta = Reference{std::vector<double>(p.h, 0.0), std::vector<double>(p.h, 0.0)};
  for (int64_t i = 0; i < p.n; ++i) {
    const RefStats s = StatsOf(p, &p.x[i * p.h]);
    for (int64_t j = 0; j < p.h; ++j) {
      const double dy = p.dy[i * p.h + j];
      const double term = dy * (p.x[i * p.h + j] - s.mean) * s.rsigma;
      dgamma->value[j] += term;
      dgamma->magnitude[j] += std::fabs(term);
      dbeta->value[j] += dy;
      dbeta->magnitude[j] += std::fabs(dy);
    }
  }
}

// Central differences of the total loss in gamma_j (a perturbation of gamma_j moves
// only column j of y, so only that column's terms are recomputed).
inline std::vector<double> FiniteDifferenceDgamma(const NormProblem& p) {
  std::vector<double> dgamma(p.h, 0.0);
  const double step = 1e-4;
  for (int64_t i = 0; i < p.n; ++i) {
    const RefStats s = StatsOf(p, &p.x[i * p.h]);
    for (int64_t j = 0; j < p.h; ++j) {
      const double xhat = (p.x[i * p.h + j] - s.mean) * s.rsigma;
      const double up = xhat * (p.Weight(j) + step) + p.Beta(j);
      const double down = xhat * (p.Weight(j) - step) + p.Beta(j);
      dgamma[j] += p.dy[i * p.h + j] * (up - down) / (2 * step);
    }
  }
  return dgamma;
}

}  // namespace testing_kernels
}  // namespace teserve

#endif  // TESERVE_TESTS_KERNELS_NORM_REFERENCE_H_
