// Tests of kernels/activation.h on the CPU: every activation kind over awkward shapes.
// Forward against the closed forms evaluated in double (GELU in its tanh form, while
// the kernel uses the equivalent sigmoid form); backward against the analytic
// derivatives in double and against central finite differences of the double forward;
// conventions at kinks and clamps, NaN propagation, extreme inputs; names; metadata
// errors.
#include "kernels/activation.h"

#include <cmath>
#include <functional>
#include <limits>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cast.h"
#include "tests/kernels/test_util.h"
#include "tests/kernels/tolerances.h"

namespace teserve {
namespace kernels {
namespace {

using ::teserve::testing_kernels::AllClose;
using ::teserve::testing_kernels::HasError;

constexpr absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;

constexpr Activation kAllKinds[] = {
    Activation::kGelu,  Activation::kGeglu,  Activation::kQgelu,  Activation::kQgeglu,
    Activation::kRelu,  Activation::kReglu,  Activation::kSrelu,  Activation::kSreglu,
    Activation::kSilu,  Activation::kSwiglu, Activation::kClampedSwiglu,
};

// ---- Closed forms in double -------------------------------------------------------

double Sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

const double kSqrt2OverPi = std::sqrt(2.0 / std::acos(-1.0));

// The activated function f of a kind (for gated kinds: what the first half gets), its
// derivative, and a magnitude for the derivative's tolerance: the sum of the absolute
// values of the terms the derivative adds (they cancel near its zeros).
struct Scalar {
  double value, grad, grad_magnitude;
};

Scalar Evaluate(Activation kind, const ActivationParams& params, double x) {
  const double c = kSqrt2OverPi;
  switch (kind) {
    case Activation::kGelu:
    case Activation::kGeglu: {
      const double t = std::tanh(c * (x + 0.044715 * x * x * x));
      const double left = 0.5 * (1.0 + t);
      const double right = 0.5 * x * (1.0 - t * t) * c * (1.0 + 3.0 * 0.044715 * x * x);
      return {0.5 * x * (1.0 + t), left + right, std::fabs(left) + std::fabs(right)};
    }
    case Activation::kQgelu:
    case Activation::kQgeglu:
    case Activation::kSilu:
    case Activation::kSwiglu:
    case Activation::kClampedSwiglu: {
      const double alpha = kind == Activation::kSilu || kind == Activation::kSwiglu ? 1.0
                           : kind == Activation::kClampedSwiglu                     ? params.alpha
                                                                                    : 1.702;
      const double s = Sigmoid(alpha * x);
      const double right = alpha * x * s * (1.0 - s);
      return {x * s, s + right, s + std::fabs(right)};
    }
    case Activation::kRelu:
    case Activation::kReglu:
      return {x > 0 ? x : 0.0, x > 0 ? 1.0 : 0.0, 1.0};
    case Activation::kSrelu:
    case Activation::kSreglu:
      return {x > 0 ? x * x : 0.0, x > 0 ? 2.0 * x : 0.0, std::fabs(2.0 * x)};
  }
  return {0, 0, 0};
}

bool Gated(Activation kind) {
  switch (kind) {
    case Activation::kGeglu:
    case Activation::kQgeglu:
    case Activation::kReglu:
    case Activation::kSreglu:
    case Activation::kSwiglu:
    case Activation::kClampedSwiglu:
      return true;
    default:
      return false;
  }
}

// Reference forward and backward of a whole tensor in double.
struct Reference {
  std::vector<double> y;
  std::vector<double> dx;
  std::vector<double> dx_magnitude;
};

Reference ComputeReference(Activation kind, const ActivationParams& params, const std::vector<float>& x,
                           const std::vector<float>& dy, int64_t rows, int64_t k) {
  Reference ref;
  const bool gated = Gated(kind);
  const int64_t width = gated ? 2 * k : k;
  ref.y.resize(rows * k);
  ref.dx.resize(rows * width);
  ref.dx_magnitude.resize(rows * width);
  const bool clamped = kind == Activation::kClampedSwiglu;
  const double limit = params.limit;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < k; ++j) {
      const double g = dy[r * k + j];
      if (!gated) {
        const Scalar s = Evaluate(kind, params, x[r * k + j]);
        ref.y[r * k + j] = s.value;
        ref.dx[r * k + j] = g * s.grad;
        ref.dx_magnitude[r * k + j] = std::fabs(g) * s.grad_magnitude;
        continue;
      }
      const double a = x[r * width + j];
      const double b = x[r * width + k + j];
      const double a_in = clamped ? std::min(a, limit) : a;
      const double b_in = clamped ? std::max(-limit, std::min(b, limit)) : b;
      const double linear = b_in + (clamped ? 1.0 : 0.0);
      const Scalar s = Evaluate(kind, params, a_in);
      const double a_pass = clamped && a > limit ? 0.0 : 1.0;
      const double b_pass = clamped && std::fabs(b) > limit ? 0.0 : 1.0;
      ref.y[r * k + j] = s.value * linear;
      ref.dx[r * width + j] = g * s.grad * a_pass * linear;
      ref.dx[r * width + k + j] = g * s.value * b_pass;
      ref.dx_magnitude[r * width + j] = std::fabs(g * s.grad_magnitude * a_pass * linear);
      ref.dx_magnitude[r * width + k + j] = std::fabs(g * s.value);
    }
  }
  return ref;
}

// Double forward of one output element from its input element(s), for finite differences.
double ForwardElement(Activation kind, const ActivationParams& params, double a, double b) {
  if (!Gated(kind)) return Evaluate(kind, params, a).value;
  if (kind != Activation::kClampedSwiglu) return Evaluate(kind, params, a).value * b;
  const double limit = params.limit;
  return Evaluate(kind, params, std::min(a, limit)).value * (std::max(-limit, std::min(b, limit)) + 1.0);
}

// Points where the function has a kink (finite differences across them are meaningless).
std::vector<double> Kinks(Activation kind, const ActivationParams& params, bool linear_half) {
  if (kind == Activation::kClampedSwiglu) {
    return linear_half ? std::vector<double>{-params.limit, params.limit} : std::vector<double>{params.limit};
  }
  if (linear_half) return {};
  switch (kind) {
    case Activation::kRelu:
    case Activation::kReglu:
    case Activation::kSrelu:
    case Activation::kSreglu:
      return {0.0};
    default:
      return {};
  }
}

// ---- Inputs ---------------------------------------------------------------------

// N(0, 3^2) values with the kinks of every kind sprinkled in (0, +-limit), so the
// derivative conventions there are compared too.
std::vector<float> Inputs(int64_t count, const ActivationParams& params, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> v(count);
  for (float& x : v) x = normal(rng);
  const float specials[] = {0.0f, params.limit, -params.limit, -0.0f};
  for (int64_t i = 5; i < count; i += 17) v[i] = specials[(i / 17) % 4];
  return v;
}

Tensor FromVector(const std::vector<float>& values, Shape shape) {
  return Tensor::FromFloats(values, std::move(shape)).value();
}

std::vector<float> Floats(const Tensor& t) { return {t.floats().begin(), t.floats().end()}; }

// ---- Parameterized over kind x shape -------------------------------------------------

struct ActivationCase {
  std::string name;
  Activation kind;
  ActivationParams params;
  int64_t rows, k;  // output [rows, k]; input [rows, k] or [rows, 2k]
};

void PrintTo(const ActivationCase& c, std::ostream* os) { *os << c.name; }

std::vector<ActivationCase> AllCases() {
  const std::pair<int64_t, int64_t> shapes[] = {{1, 1}, {1, 259}, {3, 37}, {257, 259}, {0, 7}};
  std::vector<ActivationCase> cases;
  for (Activation kind : kAllKinds) {
    for (const auto& [rows, k] : shapes) {
      cases.push_back({absl::StrCat(ActivationName(kind), "_", rows, "x", k), kind, ActivationParams(), rows, k});
    }
  }
  ActivationParams tight;
  tight.limit = 1.5f;
  tight.alpha = 1.0f;
  cases.push_back({"clamped_swiglu_limit1p5_alpha1_33x65", Activation::kClampedSwiglu, tight, 33, 65});
  return cases;
}

class ActivationShapes : public ::testing::TestWithParam<ActivationCase> {
 protected:
  void SetUp() override {
    const ActivationCase& c = GetParam();
    width_ = Gated(c.kind) ? 2 * c.k : c.k;
    x_ = Inputs(c.rows * width_, c.params, static_cast<uint32_t>(c.rows * 7919 + c.k));
    dy_ = testing_kernels::RandomFloats(c.rows * c.k, -1.0f, 1.0f, static_cast<uint32_t>(c.rows + 3 * c.k));
    ref_ = ComputeReference(c.kind, c.params, x_, dy_, c.rows, c.k);
  }

  Tensor X() const { return FromVector(x_, {GetParam().rows, width_}); }
  Tensor Dy() const { return FromVector(dy_, {GetParam().rows, GetParam().k}); }

  int64_t width_ = 0;
  std::vector<float> x_, dy_;
  Reference ref_;
};

TEST_P(ActivationShapes, ForwardMatchesClosedForm) {
  const ActivationCase& c = GetParam();
  auto y = ActivationForward(Context(), c.kind, c.params, X());
  ASSERT_TRUE(y.ok()) << y.status();
  EXPECT_EQ(y->shape(), (Shape{c.rows, c.k}));
  EXPECT_TRUE(AllClose(y->floats(), ref_.y, DType::kFloat32));
}

TEST_P(ActivationShapes, BackwardMatchesAnalyticDerivative) {
  const ActivationCase& c = GetParam();
  auto dx = ActivationBackward(Context(), c.kind, c.params, Dy(), X());
  ASSERT_TRUE(dx.ok()) << dx.status();
  EXPECT_EQ(dx->shape(), (Shape{c.rows, width_}));
  EXPECT_TRUE(AllClose(dx->floats(), ref_.dx, DType::kFloat32, ref_.dx_magnitude));
}

// Central differences of the double forward, element by element (each output element
// depends on one input element, or on a and b for gated kinds). Elements within 2h of a
// kink are skipped: the derivative there is a convention, checked above.
TEST_P(ActivationShapes, BackwardMatchesFiniteDifferences) {
  const ActivationCase& c = GetParam();
  auto dx = ActivationBackward(Context(), c.kind, c.params, Dy(), X());
  ASSERT_TRUE(dx.ok()) << dx.status();
  const double h = 1e-4;
  std::vector<double> numeric(dx->numel()), magnitude(dx->numel());
  std::vector<float> got(dx->numel());
  int64_t compared = 0;
  auto near_kink = [&](double v, bool linear_half) {
    for (double kink : Kinks(c.kind, c.params, linear_half)) {
      if (std::fabs(v - kink) < 2 * h) return true;
    }
    return false;
  };
  for (int64_t r = 0; r < c.rows; ++r) {
    for (int64_t j = 0; j < c.k; ++j) {
      const double g = dy_[r * c.k + j];
      const int64_t ia = r * width_ + j;
      const int64_t ib = ia + c.k;
      const double a = x_[ia];
      const double b = Gated(c.kind) ? x_[ib] : 0.0;
      auto f = [&](double av, double bv) { return ForwardElement(c.kind, c.params, av, bv); };
      if (!near_kink(a, false)) {
        numeric[compared] = g * (f(a + h, b) - f(a - h, b)) / (2 * h);
        magnitude[compared] = ref_.dx_magnitude[ia];
        got[compared++] = dx->floats()[ia];
      }
      if (Gated(c.kind) && !near_kink(b, true)) {
        numeric[compared] = g * (f(a, b + h) - f(a, b - h)) / (2 * h);
        magnitude[compared] = ref_.dx_magnitude[ib];
        got[compared++] = dx->floats()[ib];
      }
    }
  }
  if (c.rows * c.k > 0) {
    EXPECT_GT(compared, 0);
  }
  got.resize(compared);
  numeric.resize(compared);
  magnitude.resize(compared);
  // The FD truncation error (h^2 f''' ~ 1e-8) is far below the FP32 tolerance.
  EXPECT_TRUE(AllClose(got, numeric, DType::kFloat32, magnitude));
}

INSTANTIATE_TEST_SUITE_P(AllKinds, ActivationShapes, ::testing::ValuesIn(AllCases()),
                         [](const ::testing::TestParamInfo<ActivationCase>& info) { return info.param.name; });

// ---- Conventions and special values --------------------------------------------------

float Forward1(Activation kind, float a, float b = 1.0f, ActivationParams params = ActivationParams()) {
  Tensor x = Gated(kind) ? FromVector({a, b}, {1, 2}) : FromVector({a}, {1, 1});
  return ActivationForward(Context(), kind, params, x).value().floats()[0];
}

std::vector<float> Backward1(Activation kind, float a, float b = 1.0f, ActivationParams params = ActivationParams()) {
  Tensor x = Gated(kind) ? FromVector({a, b}, {1, 2}) : FromVector({a}, {1, 1});
  return Floats(ActivationBackward(Context(), kind, params, FromVector({1.0f}, {1, 1}), x).value());
}

TEST(Activation, GatedKindsActivateTheFirstHalf) {
  // relu(a) * b with a = 2, b = -3: 2 * -3 = -6; the other convention would give 0.
  EXPECT_EQ(Forward1(Activation::kReglu, 2.0f, -3.0f), -6.0f);
  EXPECT_EQ(Forward1(Activation::kSreglu, 2.0f, -3.0f), -12.0f);
}

TEST(Activation, ReluFamilyHasZeroGradientAtZero) {
  EXPECT_EQ(Backward1(Activation::kRelu, 0.0f)[0], 0.0f);
  EXPECT_EQ(Backward1(Activation::kSrelu, 0.0f)[0], 0.0f);
  EXPECT_EQ(Backward1(Activation::kRelu, 1e-30f)[0], 1.0f);
  EXPECT_EQ(Backward1(Activation::kReglu, 0.0f, 5.0f), (std::vector<float>{0.0f, 0.0f}));
}

TEST(Activation, ClampedSwigluClampsBothHalvesAndAddsOneToTheGate) {
  ActivationParams p;  // limit 7, alpha 1.702
  const double act_at_limit = 7.0 / (1.0 + std::exp(-1.702 * 7.0));
  // a beyond the limit acts as the limit; b is clamped to [-7, 7] and offset by 1.
  EXPECT_NEAR(Forward1(Activation::kClampedSwiglu, 100.0f, 100.0f, p), act_at_limit * 8.0, 1e-5);
  EXPECT_NEAR(Forward1(Activation::kClampedSwiglu, 100.0f, -100.0f, p), act_at_limit * -6.0, 1e-5);
  EXPECT_NEAR(Forward1(Activation::kClampedSwiglu, 100.0f, -1.0f, p), 0.0, 1e-6);
  // Clamped inputs get no gradient; the lower side of a is not clamped.
  EXPECT_EQ(Backward1(Activation::kClampedSwiglu, 8.0f, 8.0f, p), (std::vector<float>{0.0f, 0.0f}));
  const std::vector<float> below = Backward1(Activation::kClampedSwiglu, -50.0f, -7.5f, p);
  EXPECT_EQ(below[1], 0.0f);
  EXPECT_NEAR(below[0], 0.0, 1e-6);  // silu-like tail: tiny but from the unclamped branch
  // At exactly the limit the gradient passes.
  const std::vector<float> at = Backward1(Activation::kClampedSwiglu, 7.0f, 7.0f, p);
  EXPECT_GT(at[0], 0.0f);
  EXPECT_NEAR(at[1], act_at_limit, 1e-5);
}

TEST(Activation, NanPropagatesThroughEveryForward) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (Activation kind : kAllKinds) {
    EXPECT_TRUE(std::isnan(Forward1(kind, nan))) << ActivationName(kind);
    if (Gated(kind)) {
      EXPECT_TRUE(std::isnan(Forward1(kind, 1.0f, nan))) << ActivationName(kind);
    }
  }
}

TEST(Activation, ExtremeInputsStayFinite) {
  for (Activation kind : {Activation::kGelu, Activation::kQgelu, Activation::kSilu}) {
    EXPECT_EQ(Forward1(kind, -1e4f), 0.0f) << ActivationName(kind);
    EXPECT_EQ(Forward1(kind, 1e4f), 1e4f) << ActivationName(kind);
    EXPECT_EQ(Backward1(kind, -1e4f)[0], 0.0f) << ActivationName(kind);
    EXPECT_EQ(Backward1(kind, 1e4f)[0], 1.0f) << ActivationName(kind);
  }
  // In the left tail 1 + tanh(z) cancels in FP32; the kernel's sigmoid form keeps
  // gelu(-6) ~ -8e-11 relatively exact. Reference: (1 + tanh z) / 2 = 1 / (1 + e^-2z).
  const double z = kSqrt2OverPi * (-6.0 + 0.044715 * -216.0);
  const double exact = -6.0 / (1.0 + std::exp(-2.0 * z));
  EXPECT_NEAR(Forward1(Activation::kGelu, -6.0f), exact, 1e-5 * std::fabs(exact));
}

// ---- 16-bit tensors ------------------------------------------------------------------

// The fused entry points on BF16 / FP16 tensors (what LayerNormMLP runs with a 16-bit
// params_dtype): x and dy widened exactly, the FP32 op, y and dx rounded once to the
// 16-bit dtype. So they equal the FP32 entry points on the widened values, narrowed,
// bit for bit, for element-wise and gated kinds.
TEST(Activation, SixteenBitTensorsComputeInFp32AndRoundOnce) {
  const ActivationParams params;
  for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
    for (Activation kind : {Activation::kGelu, Activation::kSwiglu, Activation::kClampedSwiglu}) {
      SCOPED_TRACE(absl::StrCat(DTypeName(dtype), " ", ActivationName(kind)));
      const int64_t k = 37;
      const int64_t cols = Gated(kind) ? 2 * k : k;
      const Tensor x = Convert(Context(), testing_kernels::RandomTensor({5, cols}, -6.0f, 6.0f, 3), dtype).value();
      const Tensor dy = Convert(Context(), testing_kernels::RandomTensor({5, k}, -2.0f, 2.0f, 4), dtype).value();
      const Tensor x32 = Convert(Context(), x, DType::kFloat32).value();
      const Tensor dy32 = Convert(Context(), dy, DType::kFloat32).value();

      auto y = FusedActivationForward(Context(), kind, params, x, ActivationForwardOptions());
      ASSERT_TRUE(y.ok()) << y.status();
      ASSERT_EQ(y->y.dtype(), dtype);  // y_dtype unset: x's
      const Tensor want_y =
          Convert(Context(), ActivationForward(Context(), kind, params, x32).value(), dtype).value();
      EXPECT_TRUE(BitwiseEqual(y->y, want_y));

      auto dx = FusedActivationBackward(Context(), kind, params, dy, x, ActivationBackwardOptions());
      ASSERT_TRUE(dx.ok()) << dx.status();
      ASSERT_EQ(dx->dx.dtype(), dtype);
      const Tensor want_dx =
          Convert(Context(), ActivationBackward(Context(), kind, params, dy32, x32).value(), dtype).value();
      EXPECT_TRUE(BitwiseEqual(dx->dx, want_dx));
    }
  }
}

// ---- Names ------------------------------------------------------------------------

TEST(ActivationNames, RoundTripEveryKind) {
  for (Activation kind : kAllKinds) {
    auto parsed = ParseActivation(ActivationName(kind));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, kind);
    EXPECT_EQ(IsGated(kind), Gated(kind)) << ActivationName(kind);
  }
  EXPECT_EQ(ActivationInputWidth(Activation::kSwiglu, 5), 10);
  EXPECT_EQ(ActivationInputWidth(Activation::kGelu, 5), 5);
}

TEST(ActivationNames, UnknownNameListsTheAcceptedOnes) {
  EXPECT_THAT(ParseActivation("GeLU", "model.layers[0].layer_norm_mlp.activation"),
              HasError(kInvalid,
                       "model.layers[0].layer_norm_mlp.activation: expected one of gelu, geglu, qgelu, qgeglu, "
                       "relu, reglu, srelu, sreglu, silu, swiglu, clamped_swiglu, got 'GeLU'"));
  EXPECT_THAT(ParseActivation(""), HasError(kInvalid, "activation: expected one of gelu"));
}

// ---- Metadata errors ------------------------------------------------------------------

TEST(ActivationErrors, NameTheArgument) {
  const ActivationParams p;
  const Tensor x = FromVector({1, 2, 3}, {1, 3});
  EXPECT_THAT(ActivationForward(Context(), Activation::kSwiglu, p, x),
              HasError(kInvalid, "x.shape: expected [rows, 2k] (swiglu splits the last dimension in halves), "
                                 "got [1, 3]"));
  EXPECT_THAT(ActivationForward(Context(), Activation::kGelu, p, FromVector({1, 2, 3}, {3})),
              HasError(kInvalid, "x"));
  EXPECT_THAT(ActivationForward(Context(), Activation::kGelu, p, Tensor()), HasError(kInvalid, "x"));
  EXPECT_THAT(ActivationBackward(Context(), Activation::kGeglu, p, FromVector({1, 2}, {1, 2}),
                                 FromVector({1, 2}, {1, 2})),
              HasError(kInvalid, "dy.shape"));
  ActivationParams bad;
  bad.limit = 0.0f;
  EXPECT_THAT(ActivationForward(Context(), Activation::kClampedSwiglu, bad, FromVector({1, 2}, {1, 2})),
              HasError(kInvalid, "params.limit: expected a finite positive value, got 0"));
  bad.limit = 7.0f;
  bad.alpha = std::numeric_limits<float>::infinity();
  EXPECT_THAT(ActivationForward(Context(), Activation::kClampedSwiglu, bad, FromVector({1, 2}, {1, 2})),
              HasError(kInvalid, "params.alpha"));
  // Other kinds ignore the params.
  EXPECT_TRUE(ActivationForward(Context(), Activation::kSwiglu, bad, FromVector({1, 2}, {1, 2})).ok());
}

}  // namespace
}  // namespace kernels
}  // namespace teserve
