// Tests of kernels/l2_norm.h on the CPU: forward against the closed form
// x / sqrt(sum x^2 + eps) in double; backward against the explicit Jacobian
// r I - r^3 x x^T and against central finite differences of the double forward; closed
// properties (unit norm, scale invariance, gradient orthogonal to x); metadata errors.
#include "kernels/l2_norm.h"

#include <cmath>
#include <ostream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/kernels/test_util.h"
#include "tests/kernels/tolerances.h"

namespace teserve {
namespace kernels {
namespace {

using ::teserve::testing_kernels::AllClose;
using ::teserve::testing_kernels::HasError;
using ::teserve::testing_kernels::RandomTensor;

constexpr absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;

// Double forward of one row.
std::vector<double> L2Row(const double* x, int64_t h, double eps) {
  double sq = 0.0;
  for (int64_t j = 0; j < h; ++j) sq += x[j] * x[j];
  std::vector<double> y(h);
  for (int64_t j = 0; j < h; ++j) y[j] = x[j] / std::sqrt(sq + eps);
  return y;
}

struct L2Case {
  int64_t n, h;
  float eps;
};

void PrintTo(const L2Case& c, std::ostream* os) { *os << "[" << c.n << ", " << c.h << "] eps " << c.eps; }

class L2NormShapes : public ::testing::TestWithParam<L2Case> {
 protected:
  void SetUp() override {
    const L2Case& c = GetParam();
    const uint32_t seed = static_cast<uint32_t>(c.n * 1000 + c.h);
    x_ = RandomTensor({c.n, c.h}, -2.0f, 3.0f, seed);
    dy_ = RandomTensor({c.n, c.h}, -1.0f, 1.0f, seed + 1);
  }

  std::vector<double> Row(const Tensor& t, int64_t i) const {
    const int64_t h = GetParam().h;
    return std::vector<double>(t.floats().begin() + i * h, t.floats().begin() + (i + 1) * h);
  }

  Tensor x_, dy_;
};

TEST_P(L2NormShapes, ForwardMatchesClosedForm) {
  const L2Case& c = GetParam();
  auto out = L2NormalizationForward(Context::Cpu(), x_, c.eps);
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(out->y.shape(), x_.shape());
  std::vector<double> y, rsigma;
  for (int64_t i = 0; i < c.n; ++i) {
    const std::vector<double> x = Row(x_, i);
    const std::vector<double> yi = L2Row(x.data(), c.h, c.eps);
    y.insert(y.end(), yi.begin(), yi.end());
    double sq = 0.0;
    for (double v : x) sq += v * v;
    rsigma.push_back(1.0 / std::sqrt(sq + c.eps));
  }
  EXPECT_TRUE(AllClose(out->y.floats(), y, DType::kFloat32));
  EXPECT_TRUE(AllClose(out->rsigma.floats(), rsigma, DType::kFloat32));
}

TEST_P(L2NormShapes, BackwardMatchesExplicitJacobian) {
  const L2Case& c = GetParam();
  const L2NormForwardOutputs fwd = L2NormalizationForward(Context::Cpu(), x_, c.eps).value();
  auto dx = L2NormalizationBackward(Context::Cpu(), dy_, x_, fwd.rsigma);
  ASSERT_TRUE(dx.ok()) << dx.status();
  std::vector<double> want, magnitude;
  for (int64_t i = 0; i < c.n; ++i) {
    const std::vector<double> x = Row(x_, i), dy = Row(dy_, i);
    double sq = 0.0;
    for (double v : x) sq += v * v;
    const double r = 1.0 / std::sqrt(sq + c.eps);
    for (int64_t k = 0; k < c.h; ++k) {
      double sum = 0.0, abs_sum = 0.0;
      for (int64_t j = 0; j < c.h; ++j) {
        const double jacobian = (j == k ? r : 0.0) - r * r * r * x[j] * x[k];  // dy_j / dx_k
        sum += dy[j] * jacobian;
        abs_sum += std::fabs(dy[j] * jacobian);
      }
      want.push_back(sum);
      magnitude.push_back(abs_sum);
    }
  }
  EXPECT_TRUE(AllClose(dx->floats(), want, DType::kFloat32, magnitude));
}

TEST_P(L2NormShapes, BackwardMatchesFiniteDifferences) {
  // d/dx_k of sum_j dy_j y_j(x) by central differences of the double forward.
  const L2Case& c = GetParam();
  const L2NormForwardOutputs fwd = L2NormalizationForward(Context::Cpu(), x_, c.eps).value();
  const Tensor dx = L2NormalizationBackward(Context::Cpu(), dy_, x_, fwd.rsigma).value();
  std::vector<double> numeric, magnitude;
  const double step = 1e-6;
  for (int64_t i = 0; i < c.n; ++i) {
    std::vector<double> x = Row(x_, i);
    const std::vector<double> dy = Row(dy_, i);
    const auto loss = [&] {
      const std::vector<double> y = L2Row(x.data(), c.h, c.eps);
      double total = 0.0;
      for (int64_t j = 0; j < c.h; ++j) total += dy[j] * y[j];
      return total;
    };
    double dy_abs = 0.0, sq = 0.0;
    for (int64_t j = 0; j < c.h; ++j) dy_abs += std::fabs(dy[j]), sq += x[j] * x[j];
    for (int64_t k = 0; k < c.h; ++k) {
      const double saved = x[k];
      x[k] = saved + step;
      const double plus = loss();
      x[k] = saved - step;
      const double minus = loss();
      x[k] = saved;
      numeric.push_back((plus - minus) / (2 * step));
      magnitude.push_back(2.0 * dy_abs / std::sqrt(sq + c.eps));  // bounds sum_j |dy_j J_jk|
    }
  }
  EXPECT_TRUE(AllClose(dx.floats(), numeric, DType::kFloat32, magnitude));
}

std::vector<L2Case> AllL2Cases() {
  std::vector<L2Case> cases;
  for (float eps : {1e-6f, 0.0f, 0.5f}) {
    for (auto [n, h] : std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {3, 37}, {257, 23}, {2, 1024}, {0, 8}}) {
      cases.push_back({n, h, eps});
    }
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Kernels, L2NormShapes, ::testing::ValuesIn(AllL2Cases()),
                         [](const ::testing::TestParamInfo<L2Case>& info) {
                           const L2Case& c = info.param;
                           const std::string eps = c.eps == 0.0f ? "Eps0" : c.eps < 1e-3f ? "EpsTeDefault" : "EpsHalf";
                           return absl::StrCat(c.n, "x", c.h, "_", eps);
                         });

TEST(L2Normalization, UnitNormScaleInvarianceAndOrthogonalGradient) {
  const Tensor x = RandomTensor({4, 64}, -3.0f, 3.0f, 31u);
  const Tensor dy = RandomTensor({4, 64}, -1.0f, 1.0f, 32u);
  Tensor scaled = x.Clone().value();
  for (float& v : scaled.mutable_floats()) v *= 8.0f;  // exact in FP32
  const L2NormForwardOutputs a = L2NormalizationForward(Context::Cpu(), x, 0.0f).value();
  const L2NormForwardOutputs b = L2NormalizationForward(Context::Cpu(), scaled, 0.0f).value();
  const Tensor dx = L2NormalizationBackward(Context::Cpu(), dy, x, a.rsigma).value();
  for (int64_t i = 0; i < 4; ++i) {
    double norm_sq = 0.0, x_dot_dx = 0.0, x_abs_dx = 0.0;
    for (int64_t j = 0; j < 64; ++j) {
      const int64_t k = i * 64 + j;
      norm_sq += static_cast<double>(a.y.floats()[k]) * a.y.floats()[k];
      x_dot_dx += static_cast<double>(x.floats()[k]) * dx.floats()[k];
      x_abs_dx += std::fabs(static_cast<double>(x.floats()[k]) * dx.floats()[k]);
      EXPECT_FLOAT_EQ(a.y.floats()[k], b.y.floats()[k]) << "row " << i << " col " << j;
    }
    EXPECT_NEAR(norm_sq, 1.0, 1e-6) << "row " << i;
    EXPECT_NEAR(x_dot_dx, 0.0, 1e-6 * x_abs_dx) << "row " << i;  // the norm does not change
  }
}

TEST(L2Normalization, ZeroRowWithEpsIsZero) {
  const Tensor x = Tensor::Zeros(DType::kFloat32, {2, 5}).value();
  const L2NormForwardOutputs out = L2NormalizationForward(Context::Cpu(), x, 1e-6f).value();
  EXPECT_THAT(out.y.floats(), ::testing::Each(0.0f));
  EXPECT_THAT(out.rsigma.floats(), ::testing::Each(::testing::FloatEq(1000.0f)));
}

TEST(L2Normalization, RejectsBadMetadata) {
  const Context ctx = Context::Cpu();
  const Tensor x = RandomTensor({3, 4}, -1, 1, 1u);
  const Tensor rsigma = RandomTensor({3}, 1, 2, 2u);
  EXPECT_THAT(L2NormalizationForward(ctx, RandomTensor({3}, -1, 1, 1u), 1e-6f),
              HasError(kInvalid, "x.shape: expected rank 2"));
  EXPECT_THAT(L2NormalizationForward(ctx, Tensor::Zeros(DType::kFloat32, {3, 0}).value(), 1e-6f),
              HasError(kInvalid, "x.shape: expected [n, h] with h > 0, got [3, 0]"));
  EXPECT_THAT(L2NormalizationForward(ctx, Tensor::Zeros(DType::kInt32, {3, 4}).value(), 1e-6f),
              HasError(kInvalid, "x.dtype: expected FLOAT32, got INT32"));
  EXPECT_THAT(L2NormalizationForward(ctx, x, -1.0f), HasError(kInvalid, "eps: expected a finite value >= 0"));
  EXPECT_THAT(L2NormalizationForward(ctx, x, NAN), HasError(kInvalid, "eps"));
  EXPECT_THAT(L2NormalizationBackward(ctx, RandomTensor({3, 5}, -1, 1, 3u), x, rsigma),
              HasError(kInvalid, "dy.shape: expected [3, 4], got [3, 5]"));
  EXPECT_THAT(L2NormalizationBackward(ctx, x, x, RandomTensor({4}, 1, 2, 4u)),
              HasError(kInvalid, "rsigma.shape: expected [3], got [4]"));
  Context cuda;
  cuda.device = Device::Cuda(0);
  EXPECT_THAT(L2NormalizationForward(cuda, x, 1e-6f), HasError(kInvalid, "x.device"));
}

}  // namespace
}  // namespace kernels
}  // namespace teserve
