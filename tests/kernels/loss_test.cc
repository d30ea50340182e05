// Losses (kernels/loss.h) against FP64 closed forms written independently of the
// reference's algebra (cross entropy as -sum_j q_j log softmax_j with the smoothed
// target q spelled out, its gradient as softmax - q), central finite differences of the
// FP32 forward, the reductions (mean over elements / over non-ignored tokens, all
// ignored), shift invariance at large logits, and metadata errors naming the argument.
#include "kernels/loss.h"

#include <algorithm>
#include <cmath>
#include <ostream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/kernels/test_util.h"
#include "tests/kernels/tolerances.h"

namespace teserve {
namespace kernels {
namespace {

using testing_kernels::AllClose;
using testing_kernels::HasError;
using testing_kernels::RandomTensor;

Tensor Labels(DType dtype, const Shape& shape, const std::vector<int64_t>& values) {
  Tensor t = Tensor::Zeros(dtype, shape).value();
  for (size_t i = 0; i < values.size(); ++i) {
    if (dtype == DType::kInt32) {
      t.data<int32_t>()[i] = static_cast<int32_t>(values[i]);
    } else {
      t.data<int64_t>()[i] = values[i];
    }
  }
  return t;
}

// |got - want| <= atol + rtol |want| with FP32's table entry.
void ExpectScalarClose(double got, double want, const std::string& what) {
  const testing_kernels::Tolerance tol = testing_kernels::ToleranceFor(DType::kFloat32);
  EXPECT_NEAR(got, want, tol.atol + tol.rtol * std::fabs(want)) << what;
}

// ---------------------------------------------------------------- MSE

TEST(MseLoss, MatchesDoubleClosedForm) {
  for (const Shape& shape : {Shape{257, 3}, Shape{2, 3, 37}, Shape{1}, Shape{}}) {
    SCOPED_TRACE(ShapeToString(shape));
    const Tensor y = RandomTensor(shape, -2.0f, 2.0f, 1);
    const Tensor t = RandomTensor(shape, -2.0f, 2.0f, 2);
    const int64_t n = y.numel();
    double sum = 0.0;
    std::vector<double> dy(n), magnitude(n);
    for (int64_t k = 0; k < n; ++k) {
      const double d = double(y.floats()[k]) - t.floats()[k];
      sum += d * d;
      dy[k] = 0.75 * 2.0 * d / n;
      magnitude[k] = 0.75 * 2.0 * (std::fabs(y.floats()[k]) + std::fabs(t.floats()[k])) / n;
    }
    auto fwd = MseForward(Context(), y, t);
    ASSERT_TRUE(fwd.ok()) << fwd.status();
    EXPECT_EQ(fwd->num_elements, n);
    ExpectScalarClose(fwd->loss, sum / n, "loss");
    auto grad = MseBackward(Context(), y, t, 0.75f);
    ASSERT_TRUE(grad.ok()) << grad.status();
    EXPECT_EQ(grad->shape(), shape);
    EXPECT_TRUE(AllClose(grad->floats(), dy, DType::kFloat32, magnitude));
  }
}

TEST(MseLoss, MatchesFiniteDifferences) {
  Tensor y = RandomTensor({5, 7}, -1.0f, 1.0f, 3);
  const Tensor t = RandomTensor({5, 7}, -1.0f, 1.0f, 4);
  const Tensor grad = MseBackward(Context(), y, t, 1.0f).value();
  const float h = 1e-2f;
  for (int64_t k = 0; k < y.numel(); ++k) {
    const float saved = y.floats()[k];
    y.mutable_floats()[k] = saved + h;
    const double plus = MseForward(Context(), y, t)->loss;
    y.mutable_floats()[k] = saved - h;
    const double minus = MseForward(Context(), y, t)->loss;
    y.mutable_floats()[k] = saved;
    const double numeric = (plus - minus) / (2.0 * h);
    EXPECT_NEAR(grad.floats()[k], numeric, 2e-4 + 1e-3 * std::fabs(numeric)) << "y[" << k << "]";
  }
}

TEST(MseLoss, EmptyTensorsGiveZeroLoss) {
  const Tensor y = Tensor::Zeros(DType::kFloat32, {0, 4}).value();
  auto fwd = MseForward(Context(), y, y);
  ASSERT_TRUE(fwd.ok()) << fwd.status();
  EXPECT_EQ(fwd->loss, 0.0f);
  EXPECT_EQ(fwd->num_elements, 0);
  auto grad = MseBackward(Context(), y, y, 1.0f);
  ASSERT_TRUE(grad.ok()) << grad.status();
  EXPECT_EQ(grad->shape(), (Shape{0, 4}));
}

TEST(MseLoss, RejectsMismatchedTarget) {
  const Tensor y = Tensor::Zeros(DType::kFloat32, {2, 3}).value();
  EXPECT_THAT(MseForward(Context(), y, Tensor::Zeros(DType::kFloat32, {3, 2}).value()),
              HasError(absl::StatusCode::kInvalidArgument, "target.shape: expected [2, 3], got [3, 2]"));
  EXPECT_THAT(MseBackward(Context(), y, Tensor::Zeros(DType::kInt64, {2, 3}).value(), 1.0f),
              HasError(absl::StatusCode::kInvalidArgument, "target.dtype: expected FLOAT32, got INT64"));
  EXPECT_THAT(MseForward(Context(), Tensor(), y),
              HasError(absl::StatusCode::kInvalidArgument, "y: expected a tensor, got an undefined tensor"));
}

// ---------------------------------------------------------------- cross entropy

// The FP64 reference: per-token loss -sum_j q_j log p_j and gradient (p - q) with
// q = (1 - s) onehot(label) + s / V, mean over the non-ignored tokens.
struct CrossEntropyReference {
  double loss = 0.0;
  int64_t num_valid = 0;
  std::vector<double> per_token;
  std::vector<double> grad;       // for grad_loss
  std::vector<double> magnitude;  // |p| + |q| terms of each gradient entry, scaled alike
};

CrossEntropyReference Reference(const Tensor& logits, const Tensor& labels, double s, int64_t ignore_index,
                                double grad_loss) {
  const int64_t v = logits.dim(-1);
  const int64_t n = logits.numel() / v;
  CrossEntropyReference ref;
  ref.per_token.assign(n, 0.0);
  ref.grad.assign(n * v, 0.0);
  ref.magnitude.assign(n * v, 0.0);
  for (int64_t r = 0; r < n; ++r) {
    const int64_t label = labels.dtype() == DType::kInt32 ? labels.data<int32_t>()[r] : labels.data<int64_t>()[r];
    if (label != ignore_index) ++ref.num_valid;
  }
  for (int64_t r = 0; r < n; ++r) {
    const int64_t label = labels.dtype() == DType::kInt32 ? labels.data<int32_t>()[r] : labels.data<int64_t>()[r];
    if (label == ignore_index) continue;
    const float* x = logits.floats().data() + r * v;
    double max = x[0];
    for (int64_t j = 1; j < v; ++j) max = std::max<double>(max, x[j]);
    double z = 0.0;
    for (int64_t j = 0; j < v; ++j) z += std::exp(x[j] - max);
    for (int64_t j = 0; j < v; ++j) {
      const double log_p = (x[j] - max) - std::log(z);
      const double q = s / v + (j == label ? 1.0 - s : 0.0);
      ref.per_token[r] -= q * log_p;
      ref.grad[r * v + j] = grad_loss * (std::exp(log_p) - q) / ref.num_valid;
      ref.magnitude[r * v + j] = std::fabs(grad_loss) * (std::exp(log_p) + q) / ref.num_valid;
    }
    ref.loss += ref.per_token[r] / ref.num_valid;
  }
  return ref;
}

struct CeCase {
  std::string name;
  Shape logits_shape;
  float label_smoothing;
  int64_t ignore_index;
  DType label_dtype;
  int ignored_every;  // every k-th token gets ignore_index (0: none)
};

void PrintTo(const CeCase& c, std::ostream* os) { *os << c.name; }

class CrossEntropyTest : public testing::TestWithParam<CeCase> {
 protected:
  void SetUp() override {
    const CeCase& c = GetParam();
    logits_ = RandomTensor(c.logits_shape, -4.0f, 4.0f, 11);
    const int64_t v = c.logits_shape.back();
    const Shape leading(c.logits_shape.begin(), c.logits_shape.end() - 1);
    const int64_t n = logits_.numel() / v;
    std::vector<int64_t> values(n);
    for (int64_t r = 0; r < n; ++r) {
      values[r] = (r * 7 + 3) % v;
      if (c.ignored_every > 0 && r % c.ignored_every == 1) values[r] = c.ignore_index;
    }
    labels_ = Labels(c.label_dtype, leading, values);
    options_.label_smoothing = c.label_smoothing;
    options_.ignore_index = c.ignore_index;
  }

  Tensor logits_;
  Tensor labels_;
  CrossEntropyOptions options_;
};

TEST_P(CrossEntropyTest, MatchesDoubleClosedForm) {
  const CrossEntropyReference ref =
      Reference(logits_, labels_, options_.label_smoothing, options_.ignore_index, /*grad_loss=*/1.5);
  auto fwd = CrossEntropyForward(Context(), logits_, labels_, options_);
  ASSERT_TRUE(fwd.ok()) << fwd.status();
  EXPECT_EQ(fwd->num_valid, ref.num_valid);
  ExpectScalarClose(fwd->loss, ref.loss, "loss");
  EXPECT_EQ(fwd->per_token_loss.shape(), labels_.shape());
  EXPECT_TRUE(AllClose(fwd->per_token_loss.floats(), ref.per_token, DType::kFloat32));
  auto grad = CrossEntropyBackward(Context(), logits_, labels_, fwd->lse, fwd->num_valid, options_, 1.5f);
  ASSERT_TRUE(grad.ok()) << grad.status();
  EXPECT_EQ(grad->shape(), logits_.shape());
  EXPECT_TRUE(AllClose(grad->floats(), ref.grad, DType::kFloat32, ref.magnitude));
}

TEST_P(CrossEntropyTest, MatchesFiniteDifferences) {
  auto fwd = CrossEntropyForward(Context(), logits_, labels_, options_).value();
  const Tensor grad =
      CrossEntropyBackward(Context(), logits_, labels_, fwd.lse, fwd.num_valid, options_, 1.0f).value();
  const int64_t n = logits_.numel();
  const int64_t stride = std::max<int64_t>(1, n / 64);
  const float h = 1e-2f;
  for (int64_t k = 0; k < n; k += stride) {
    const float saved = logits_.floats()[k];
    logits_.mutable_floats()[k] = saved + h;
    const double plus = CrossEntropyForward(Context(), logits_, labels_, options_)->loss;
    logits_.mutable_floats()[k] = saved - h;
    const double minus = CrossEntropyForward(Context(), logits_, labels_, options_)->loss;
    logits_.mutable_floats()[k] = saved;
    const double numeric = (plus - minus) / (2.0 * h);
    // FP32 losses of magnitude ~1 differenced over 2h: ~1e-5 of rounding noise.
    EXPECT_NEAR(grad.floats()[k], numeric, 5e-5 + 1e-3 * std::fabs(numeric)) << "logits[" << k << "]";
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cases, CrossEntropyTest,
    testing::Values(CeCase{"plain_4x10", {4, 10}, 0.0f, -100, DType::kInt64, 0},
                    CeCase{"smoothing_0p1_weird_3x37x23", {3, 37, 23}, 0.1f, -100, DType::kInt64, 0},
                    CeCase{"smoothing_1_2x5x7", {2, 5, 7}, 1.0f, -100, DType::kInt32, 0},
                    CeCase{"ignored_every_3rd_int32_9x6", {9, 6}, 0.0f, -100, DType::kInt32, 3},
                    CeCase{"ignore_index_is_a_class_6x5", {6, 5}, 0.2f, 2, DType::kInt64, 2},
                    CeCase{"one_class_5x1", {5, 1}, 0.3f, -100, DType::kInt64, 0},
                    CeCase{"single_token_rank1_V50", {50}, 0.05f, -1, DType::kInt64, 0},
                    CeCase{"vocab_1000_2x1000", {2, 1000}, 0.1f, -100, DType::kInt64, 0}),
    [](const testing::TestParamInfo<CeCase>& info) { return info.param.name; });

TEST(CrossEntropy, AllIgnoredBatchGivesZeroLossAndGradient) {
  const Tensor logits = RandomTensor({3, 8}, -1.0f, 1.0f, 5);
  const Tensor labels = Labels(DType::kInt64, {3}, {-100, -100, -100});
  CrossEntropyOptions options;
  options.label_smoothing = 0.1f;
  auto fwd = CrossEntropyForward(Context(), logits, labels, options);
  ASSERT_TRUE(fwd.ok()) << fwd.status();
  EXPECT_EQ(fwd->loss, 0.0f);
  EXPECT_EQ(fwd->num_valid, 0);
  for (float v : fwd->per_token_loss.floats()) EXPECT_EQ(v, 0.0f);
  auto grad = CrossEntropyBackward(Context(), logits, labels, fwd->lse, 0, options, 1.0f);
  ASSERT_TRUE(grad.ok()) << grad.status();
  for (float v : grad->floats()) EXPECT_EQ(v, 0.0f);
}

TEST(CrossEntropy, IgnoredTokensGetZeroGradientRows) {
  const Tensor logits = RandomTensor({4, 5}, -1.0f, 1.0f, 6);
  const Tensor labels = Labels(DType::kInt64, {4}, {1, -100, 4, -100});
  auto fwd = CrossEntropyForward(Context(), logits, labels, CrossEntropyOptions()).value();
  EXPECT_EQ(fwd.num_valid, 2);
  EXPECT_EQ(fwd.per_token_loss.floats()[1], 0.0f);
  const Tensor grad =
      CrossEntropyBackward(Context(), logits, labels, fwd.lse, 2, CrossEntropyOptions(), 1.0f).value();
  for (int64_t r : {1, 3}) {
    for (int64_t j = 0; j < 5; ++j) EXPECT_EQ(grad.floats()[r * 5 + j], 0.0f) << r << "," << j;
  }
  // Each kept row of (softmax - onehot) / 2 sums to zero.
  for (int64_t r : {0, 2}) {
    double sum = 0.0;
    for (int64_t j = 0; j < 5; ++j) sum += grad.floats()[r * 5 + j];
    EXPECT_NEAR(sum, 0.0, 1e-6);
  }
}

// CE(x + c) = CE(x) for a per-row constant c: no overflow at logits around 1e4.
TEST(CrossEntropy, LargeLogitsAreShiftInvariant) {
  const Tensor logits = RandomTensor({4, 16}, -3.0f, 3.0f, 7);
  Tensor shifted = logits.Clone().value();
  for (float& x : shifted.mutable_floats()) x += 10000.0f;
  const Tensor labels = Labels(DType::kInt64, {4}, {0, 5, 9, 15});
  CrossEntropyOptions options;
  options.label_smoothing = 0.1f;
  const CrossEntropyReference ref = Reference(logits, labels, 0.1, -100, 1.0);
  auto fwd = CrossEntropyForward(Context(), shifted, labels, options).value();
  // The shifted inputs are the unshifted ones rounded to FP32 spacing at 1e4 (2^-10).
  EXPECT_NEAR(fwd.loss, ref.loss, 4e-3);
  EXPECT_TRUE(std::isfinite(fwd.loss));
}

TEST(CrossEntropy, RejectsLabelsOutOfRangeNamingTheIndex) {
  const Tensor logits = RandomTensor({2, 3, 5}, -1.0f, 1.0f, 8);
  EXPECT_THAT(CrossEntropyForward(Context(), logits, Labels(DType::kInt64, {2, 3}, {0, 1, 5, 2, 3, 4}),
                                  CrossEntropyOptions()),
              HasError(absl::StatusCode::kInvalidArgument,
                       "labels[2]: expected a class in [0, 5) or ignore_index -100, got 5"));
  EXPECT_THAT(CrossEntropyForward(Context(), logits, Labels(DType::kInt32, {2, 3}, {0, 1, 2, 3, 4, -1}),
                                  CrossEntropyOptions()),
              HasError(absl::StatusCode::kInvalidArgument,
                       "labels[5]: expected a class in [0, 5) or ignore_index -100, got -1"));
  CrossEntropyOptions minus_one;
  minus_one.ignore_index = -1;
  EXPECT_TRUE(CrossEntropyForward(Context(), logits, Labels(DType::kInt32, {2, 3}, {0, 1, 2, 3, 4, -1}), minus_one)
                  .ok());
}

TEST(CrossEntropy, RejectsBadMetadataNamingTheArgument) {
  const Tensor logits = RandomTensor({2, 5}, -1.0f, 1.0f, 9);
  const Tensor labels = Labels(DType::kInt64, {2}, {0, 1});
  const CrossEntropyOptions plain;
  EXPECT_THAT(CrossEntropyForward(Context(), logits, Tensor::Zeros(DType::kFloat32, {2}).value(), plain),
              HasError(absl::StatusCode::kInvalidArgument,
                       "labels.dtype: expected INT64 or INT32 (class labels), got FLOAT32"));
  EXPECT_THAT(CrossEntropyForward(Context(), logits, Labels(DType::kInt64, {2, 1}, {0, 1}), plain),
              HasError(absl::StatusCode::kInvalidArgument,
                       "labels.shape: expected [2] (the leading dimensions of the logits), got [2, 1]"));
  EXPECT_THAT(CrossEntropyForward(Context(), Tensor::Zeros(DType::kFloat32, {2, 0}).value(), labels, plain),
              HasError(absl::StatusCode::kInvalidArgument,
                       "logits.shape: expected [..., V] with V >= 1 classes, got [2, 0]"));
  EXPECT_THAT(CrossEntropyForward(Context(), Tensor::Zeros(DType::kInt64, {2, 5}).value(), labels, plain),
              HasError(absl::StatusCode::kInvalidArgument, "logits.dtype: expected FLOAT32, got INT64"));
  for (float bad : {-0.1f, 1.5f, std::nanf("")}) {
    CrossEntropyOptions options;
    options.label_smoothing = bad;
    EXPECT_THAT(CrossEntropyForward(Context(), logits, labels, options),
                HasError(absl::StatusCode::kInvalidArgument, "label_smoothing: expected a value in [0, 1], got"));
  }
  auto fwd = CrossEntropyForward(Context(), logits, labels, plain).value();
  EXPECT_THAT(CrossEntropyBackward(Context(), logits, labels, fwd.lse, 3, plain, 1.0f),
              HasError(absl::StatusCode::kInvalidArgument, "num_valid: expected a count in 0..2 (the tokens), got 3"));
  EXPECT_THAT(CrossEntropyBackward(Context(), logits, labels, Tensor::Zeros(DType::kFloat32, {3}).value(), 2,
                                   plain, 1.0f),
              HasError(absl::StatusCode::kInvalidArgument, "lse.shape: expected [2], got [3]"));
}

TEST(CrossEntropy, CheckLabelsNamesTheCallersField) {
  EXPECT_THAT(CheckCrossEntropyLabels(Labels(DType::kInt64, {3}, {0, 9, 1}), {3}, 4, -100, "target"),
              HasError(absl::StatusCode::kInvalidArgument,
                       "target[1]: expected a class in [0, 4) or ignore_index -100, got 9"));
  EXPECT_TRUE(CheckCrossEntropyLabels(Labels(DType::kInt64, {3}, {0, -100, 3}), {3}, 4, -100, "target").ok());
}

// A build without the CUDA backend says so for a CUDA context (with it, MSE runs there:
// tests/gpu/loss).
TEST(Loss, CudaContextsWithoutTheCudaBackendAreUnimplemented) {
#if TESERVE_WITH_CUDA
  GTEST_SKIP() << "built with CUDA: tests/gpu/loss runs MSE on the device";
#else
  Context cuda;
  cuda.device = Device::Cuda(0);
  const Tensor y = Tensor::Borrow(nullptr, DType::kFloat32, {0}, Device::Cuda(0));
  EXPECT_THAT(MseForward(cuda, y, y),
              HasError(absl::StatusCode::kUnimplemented, "MseForward has no kernel for cuda:0 (teserve was built "
                                                         "without CUDA)"));
#endif
}

}  // namespace
}  // namespace kernels
}  // namespace teserve
