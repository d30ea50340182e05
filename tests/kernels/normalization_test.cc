// Tests of kernels/normalization.h on the CPU: LayerNorm and RMSNorm over awkward
// shapes, with and without zero-centered gamma. Forward against the direct double
// formula; backward against an analytic double reference (the explicit Jacobian) and
// against central finite differences of the double forward formula; metadata errors.
#include "kernels/normalization.h"

#include <cmath>
#include <ostream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/kernels/norm_reference.h"
#include "tests/kernels/test_util.h"
#include "tests/kernels/tolerances.h"

namespace teserve {
namespace kernels {
namespace {

using ::teserve::testing_kernels::AllClose;
using ::teserve::testing_kernels::HasError;
using ::teserve::testing_kernels::Norm;
using ::teserve::testing_kernels::NormProblem;
using ::teserve::testing_kernels::RandomTensor;
using ::teserve::testing_kernels::Reference;
using ::teserve::testing_kernels::ToDoubles;

constexpr float kEps = 1e-5f;
constexpr absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;

struct NormCase {
  Norm norm;
  int64_t n, h;
  bool zero_centered;
};

std::string NormCaseName(const ::testing::TestParamInfo<NormCase>& info) {
  const NormCase& c = info.param;
  return absl::StrCat(c.norm == Norm::kLayerNorm ? "LayerNorm" : "RmsNorm", "_", c.n, "x", c.h,
                      c.zero_centered ? "_ZeroCentered" : "_Plain");
}

void PrintTo(const NormCase& c, std::ostream* os) {
  *os << (c.norm == Norm::kLayerNorm ? "LayerNorm" : "RmsNorm") << " [" << c.n << ", " << c.h << "]"
      << (c.zero_centered ? " zero-centered gamma" : "");
}

class NormShapes : public ::testing::TestWithParam<NormCase> {
 protected:
  void SetUp() override {
    const NormCase& c = GetParam();
    const uint32_t seed = static_cast<uint32_t>(c.n * 1000 + c.h);
    x_ = RandomTensor({c.n, c.h}, -2.0f, 3.0f, seed);  // mean 0.5: LayerNorm must subtract it
    gamma_ = c.zero_centered ? RandomTensor({c.h}, -0.5f, 0.5f, seed + 1)
                             : RandomTensor({c.h}, 0.5f, 1.5f, seed + 1);
    beta_ = RandomTensor({c.h}, -1.0f, 1.0f, seed + 2);
    dy_ = RandomTensor({c.n, c.h}, -1.0f, 1.0f, seed + 3);
    problem_ = NormProblem{c.norm, c.n, c.h, c.zero_centered, kEps, ToDoubles(x_.floats()),
                           ToDoubles(gamma_.floats()), ToDoubles(beta_.floats()), ToDoubles(dy_.floats())};
  }

  bool layer_norm() const { return GetParam().norm == Norm::kLayerNorm; }

  NormForwardOutputs Forward() const {
    auto out = layer_norm() ? LayerNormForward(Context::Cpu(), x_, gamma_, beta_, kEps, GetParam().zero_centered)
                            : RmsNormForward(Context::Cpu(), x_, gamma_, kEps, GetParam().zero_centered);
    EXPECT_TRUE(out.ok()) << out.status();
    return out.ok() ? *std::move(out) : NormForwardOutputs{};
  }

  NormBackwardOutputs Backward(const NormForwardOutputs& fwd) const {
    auto out = layer_norm()
                   ? LayerNormBackward(Context::Cpu(), dy_, x_, fwd.mu, fwd.rsigma, gamma_, GetParam().zero_centered)
                   : RmsNormBackward(Context::Cpu(), dy_, x_, fwd.rsigma, gamma_, GetParam().zero_centered);
    EXPECT_TRUE(out.ok()) << out.status();
    return out.ok() ? *std::move(out) : NormBackwardOutputs{};
  }

  Tensor x_, gamma_, beta_, dy_;
  NormProblem problem_;
};

TEST_P(NormShapes, ForwardMatchesDoubleFormula) {
  const NormForwardOutputs out = Forward();
  ASSERT_TRUE(out.y.defined());
  const Reference y = testing_kernels::ForwardY(problem_);
  EXPECT_TRUE(AllClose(out.y.floats(), y.value, DType::kFloat32, y.magnitude));
  std::vector<double> mean, rsigma, mean_magnitude;
  for (int64_t i = 0; i < problem_.n; ++i) {
    const auto s = testing_kernels::StatsOf(problem_, &problem_.x[i * problem_.h]);
    mean.push_back(s.mean);
    rsigma.push_back(s.rsigma);
    double abs_sum = 0.0;
    for (int64_t j = 0; j < problem_.h; ++j) abs_sum += std::fabs(problem_.x[i * problem_.h + j]);
    mean_magnitude.push_back(abs_sum / problem_.h);
  }
  EXPECT_TRUE(AllClose(out.rsigma.floats(), rsigma, DType::kFloat32));
  ASSERT_EQ(out.mu.defined(), layer_norm());
  if (layer_norm()) {
    EXPECT_TRUE(AllClose(out.mu.floats(), mean, DType::kFloat32, mean_magnitude));
  }
}

TEST_P(NormShapes, BackwardMatchesAnalyticDoubleReference) {
  const NormBackwardOutputs grads = Backward(Forward());
  ASSERT_TRUE(grads.dx.defined());
  const Reference dx = testing_kernels::JacobianDx(problem_);
  EXPECT_TRUE(AllClose(grads.dx.floats(), dx.value, DType::kFloat32, dx.magnitude));
  Reference dgamma, dbeta;
  testing_kernels::ParameterGradients(problem_, &dgamma, &dbeta);
  EXPECT_TRUE(AllClose(grads.dgamma.floats(), dgamma.value, DType::kFloat32, dgamma.magnitude));
  ASSERT_EQ(grads.dbeta.defined(), layer_norm());
  if (layer_norm()) {
    EXPECT_TRUE(AllClose(grads.dbeta.floats(), dbeta.value, DType::kFloat32, dbeta.magnitude));
  }
}

TEST_P(NormShapes, BackwardMatchesFiniteDifferences) {
  const NormBackwardOutputs grads = Backward(Forward());
  ASSERT_TRUE(grads.dx.defined());
  // The Jacobian reference supplies the magnitudes; the values come from differences.
  const Reference jacobian = testing_kernels::JacobianDx(problem_);
  EXPECT_TRUE(AllClose(grads.dx.floats(), testing_kernels::FiniteDifferenceDx(problem_),
                       DType::kFloat32, jacobian.magnitude));
  Reference dgamma, dbeta;
  testing_kernels::ParameterGradients(problem_, &dgamma, &dbeta);
  EXPECT_TRUE(AllClose(grads.dgamma.floats(), testing_kernels::FiniteDifferenceDgamma(problem_),
                       DType::kFloat32, dgamma.magnitude));
}

std::vector<NormCase> AllNormCases() {
  std::vector<NormCase> cases;
  for (Norm norm : {Norm::kLayerNorm, Norm::kRmsNorm}) {
    for (bool zero_centered : {false, true}) {
      for (auto [n, h] : std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {3, 37}, {257, 259}, {2, 1024}, {0, 8}}) {
        cases.push_back({norm, n, h, zero_centered});
      }
    }
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Kernels, NormShapes, ::testing::ValuesIn(AllNormCases()), NormCaseName);

Tensor Filled(Shape shape, float value) {
  Tensor t = Tensor::Zeros(DType::kFloat32, std::move(shape)).value();
  for (float& v : t.mutable_floats()) v = value;
  return t;
}

TEST(LayerNorm, ConstantRowGivesBetaAndEpsOnlyRsigma) {
  const Tensor x = Filled({2, 5}, 4.0f);
  const Tensor gamma = Filled({5}, 3.0f);
  const Tensor beta = Tensor::FromFloats({1, -2, 0.5f, 0, 7}, {5}).value();
  auto out = LayerNormForward(Context::Cpu(), x, gamma, beta, kEps, false);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_THAT(out->y.floats(), ::testing::ElementsAre(1, -2, 0.5f, 0, 7, 1, -2, 0.5f, 0, 7));
  EXPECT_THAT(out->mu.floats(), ::testing::Each(4.0f));
  EXPECT_THAT(out->rsigma.floats(), ::testing::Each(static_cast<float>(1.0 / std::sqrt(double{kEps}))));
}

// With zero-centered gamma the weight is 1 + gamma: gamma = 0 must behave exactly like
// plain gamma = 1, for both norms and both directions.
TEST(ZeroCenteredGamma, ZeroGammaIsExactlyUnitWeight) {
  const Tensor x = RandomTensor({3, 37}, -2.0f, 3.0f, 11u);
  const Tensor dy = RandomTensor({3, 37}, -1.0f, 1.0f, 12u);
  const Tensor zeros = Filled({37}, 0.0f), ones = Filled({37}, 1.0f), beta = Filled({37}, 0.25f);
  const Context ctx = Context::Cpu();
  auto ln_zc = LayerNormForward(ctx, x, zeros, beta, kEps, true).value();
  auto ln = LayerNormForward(ctx, x, ones, beta, kEps, false).value();
  EXPECT_TRUE(BitwiseEqual(ln_zc.y, ln.y));
  auto ln_zc_b = LayerNormBackward(ctx, dy, x, ln_zc.mu, ln_zc.rsigma, zeros, true).value();
  auto ln_b = LayerNormBackward(ctx, dy, x, ln.mu, ln.rsigma, ones, false).value();
  EXPECT_TRUE(BitwiseEqual(ln_zc_b.dx, ln_b.dx));
  EXPECT_TRUE(BitwiseEqual(ln_zc_b.dgamma, ln_b.dgamma));
  auto rms_zc = RmsNormForward(ctx, x, zeros, kEps, true).value();
  auto rms = RmsNormForward(ctx, x, ones, kEps, false).value();
  EXPECT_TRUE(BitwiseEqual(rms_zc.y, rms.y));
  auto rms_zc_b = RmsNormBackward(ctx, dy, x, rms_zc.rsigma, zeros, true).value();
  auto rms_b = RmsNormBackward(ctx, dy, x, rms.rsigma, ones, false).value();
  EXPECT_TRUE(BitwiseEqual(rms_zc_b.dx, rms_b.dx));
}

TEST(RmsNorm, UnitWeightGivesUnitRootMeanSquare) {
  const Tensor x = RandomTensor({4, 259}, -5.0f, 5.0f, 13u);
  auto out = RmsNormForward(Context::Cpu(), x, Filled({259}, 1.0f), /*eps=*/0.0f, false);
  ASSERT_TRUE(out.ok()) << out.status();
  std::vector<double> rms;
  for (int64_t i = 0; i < 4; ++i) {
    double sq = 0.0;
    for (int64_t j = 0; j < 259; ++j) sq += double{out->y.floats()[i * 259 + j]} * out->y.floats()[i * 259 + j];
    rms.push_back(std::sqrt(sq / 259));
  }
  EXPECT_TRUE(AllClose(absl::MakeConstSpan(std::vector<float>(rms.begin(), rms.end())),
                       std::vector<double>(4, 1.0), DType::kFloat32));
  EXPECT_FALSE(out->mu.defined());
}

// ---- Metadata errors name the argument and say expected vs got. ----

class NormErrors : public ::testing::Test {
 protected:
  const Context ctx_ = Context::Cpu();
  const Tensor x_ = Filled({3, 4}, 1.0f);
  const Tensor gamma_ = Filled({4}, 1.0f);
  const Tensor beta_ = Filled({4}, 0.0f);
  const Tensor stats_ = Filled({3}, 1.0f);
};

TEST_F(NormErrors, ForwardRejectsBadInputs) {
  EXPECT_THAT(LayerNormForward(ctx_, Filled({12}, 1.0f), gamma_, beta_, kEps, false),
              HasError(kInvalid, "x.shape: expected [n, h] with h > 0, got [12]"));
  EXPECT_THAT(RmsNormForward(ctx_, Filled({3, 0}, 1.0f), Filled({0}, 1.0f), kEps, false),
              HasError(kInvalid, "x.shape: expected [n, h] with h > 0, got [3, 0]"));
  EXPECT_THAT(LayerNormForward(ctx_, Tensor::Zeros(DType::kBFloat16, {3, 4}).value(), gamma_, beta_, kEps, false),
              HasError(kInvalid, "x.dtype: expected FLOAT32, got BFLOAT16"));
  EXPECT_THAT(LayerNormForward(ctx_, x_, Filled({5}, 1.0f), beta_, kEps, false),
              HasError(kInvalid, "gamma.shape: expected [4], got [5]"));
  EXPECT_THAT(LayerNormForward(ctx_, x_, gamma_, Tensor::Zeros(DType::kFloat16, {4}).value(), kEps, false),
              HasError(kInvalid, "beta.dtype: expected FLOAT32, got FLOAT16"));
  EXPECT_THAT(RmsNormForward(ctx_, x_, gamma_, -1e-5f, false), HasError(kInvalid, "eps: expected a finite value >= 0"));
}

TEST_F(NormErrors, BackwardRejectsMismatchedShapes) {
  EXPECT_THAT(LayerNormBackward(ctx_, Filled({4, 3}, 1.0f), x_, stats_, stats_, gamma_, false),
              HasError(kInvalid, "dy.shape: expected [3, 4], got [4, 3]"));
  EXPECT_THAT(LayerNormBackward(ctx_, x_, x_, Filled({4}, 0.0f), stats_, gamma_, false),
              HasError(kInvalid, "mu.shape: expected [3], got [4]"));
  EXPECT_THAT(RmsNormBackward(ctx_, x_, x_, Filled({3, 1}, 1.0f), gamma_, false),
              HasError(kInvalid, "rsigma.shape: expected [3], got [3, 1]"));
  EXPECT_THAT(RmsNormBackward(ctx_, x_, x_, stats_, Tensor(), false),
              HasError(kInvalid, "gamma: expected a tensor, got an undefined tensor"));
}

TEST_F(NormErrors, CudaContextIsUnimplementedAndNamesTheOp) {
  float storage[12] = {}, params[4] = {};
  Context cuda;
  cuda.device = Device::Cuda(0);
  const Tensor x = Tensor::Borrow(storage, DType::kFloat32, {3, 4}, Device::Cuda(0));
  const Tensor gamma = Tensor::Borrow(params, DType::kFloat32, {4}, Device::Cuda(0));
  EXPECT_THAT(RmsNormForward(cuda, x, gamma, kEps, false),
              HasError(absl::StatusCode::kUnimplemented, "RmsNormForward"));
  EXPECT_THAT(RmsNormForward(ctx_, x, gamma, kEps, false), HasError(kInvalid, "x.device: expected cpu, got cuda:0"));
}

}  // namespace
}  // namespace kernels
}  // namespace teserve
