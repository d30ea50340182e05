// Scaled softmax (kernels/softmax.h) against an FP64 reference written from the contract
// (which keys each variant lets row i see, exp normalized over those), the backward
// against its FP64 closed form and against central finite differences of the FP64
// forward, fully masked rows (zeros, zero gradient), shift invariance at large scores,
// and metadata errors naming the argument.
#include "kernels/softmax.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <ostream>
#include <random>
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

struct Case {
  std::string name;
  Shape shape;  // [batches, heads, sq, sk]
  float scale;
  SoftmaxMask kind;
  float range;  // scores uniform in [-range, range)
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

// BOOL [b, 1, sq, sk]: about a third of the keys masked; row 0 of batch 0 fully masked
// and row sq - 1 of the last batch fully visible.
Tensor PaddingMask(const Shape& shape) {
  const int64_t b = shape[0], sq = shape[2], sk = shape[3];
  Tensor m = Tensor::Zeros(DType::kBool, {b, 1, sq, sk}).value();
  uint8_t* v = m.data<uint8_t>();
  std::mt19937 rng(5);
  std::bernoulli_distribution masked(1.0 / 3.0);
  for (int64_t k = 0; k < m.numel(); ++k) v[k] = masked(rng) ? 1 : 0;
  for (int64_t j = 0; j < sk; ++j) {
    v[j] = 1;
    v[((b - 1) * sq + sq - 1) * sk + j] = 0;
  }
  return m;
}

// Whether query i may attend to key j under the case's variant.
bool Visible(const Case& c, const Tensor& mask, int64_t b, int64_t i, int64_t j) {
  const int64_t sq = c.shape[2], sk = c.shape[3];
  switch (c.kind) {
    case SoftmaxMask::kNone:
      return true;
    case SoftmaxMask::kPadding:
      return mask.data<uint8_t>()[(b * sq + i) * sk + j] == 0;
    case SoftmaxMask::kCausalTopLeft:
      return j <= i;
    case SoftmaxMask::kCausalBottomRight:
      return j - (sk - sq) <= i;
  }
  return false;
}

// FP64 forward over scores given as doubles.
std::vector<double> ReferenceForward(const Case& c, const Tensor& mask, const std::vector<double>& x) {
  const int64_t heads = c.shape[1], sq = c.shape[2], sk = c.shape[3];
  const int64_t rows = c.shape[0] * heads * sq;
  std::vector<double> y(x.size(), 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t b = r / (heads * sq), i = r % sq;
    double max = -INFINITY;
    for (int64_t j = 0; j < sk; ++j) {
      if (Visible(c, mask, b, i, j)) max = std::max(max, c.scale * x[r * sk + j]);
    }
    if (max == -INFINITY) continue;
    double sum = 0.0;
    for (int64_t j = 0; j < sk; ++j) {
      if (Visible(c, mask, b, i, j)) sum += std::exp(c.scale * x[r * sk + j] - max);
    }
    for (int64_t j = 0; j < sk; ++j) {
      if (Visible(c, mask, b, i, j)) y[r * sk + j] = std::exp(c.scale * x[r * sk + j] - max) / sum;
    }
  }
  return y;
}

class ScaledSoftmaxTest : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    const Case& c = GetParam();
    x_ = RandomTensor(c.shape, -c.range, c.range, 21);
    dy_ = RandomTensor(c.shape, -1.0f, 1.0f, 22);
    if (c.kind == SoftmaxMask::kPadding) mask_ = PaddingMask(c.shape);
    sk_ = c.shape[3];
  }

  std::vector<double> XDoubles() const { return std::vector<double>(x_.floats().begin(), x_.floats().end()); }

  Tensor x_, dy_, mask_;
  int64_t sk_ = 0;
};

TEST_P(ScaledSoftmaxTest, ForwardMatchesFp64Reference) {
  const Case& c = GetParam();
  auto y_or = ScaledSoftmaxForward(Context::Cpu(), x_, c.scale, c.kind, mask_);
  ASSERT_TRUE(y_or.ok()) << y_or.status();
  const Tensor& y = *y_or;
  ASSERT_EQ(y.shape(), c.shape);
  const std::vector<double> want = ReferenceForward(c, mask_, XDoubles());
  // Error scale of y_j: the rounding of scale * x_j and of the row max, carried by exp.
  std::vector<double> mag(want.size());
  for (size_t r = 0; r * sk_ < want.size(); ++r) {
    double row_max = 0.0;
    for (int64_t j = 0; j < sk_; ++j) {
      row_max = std::max(row_max, std::fabs(static_cast<double>(c.scale) * x_.floats()[r * sk_ + j]));
    }
    for (int64_t j = 0; j < sk_; ++j) {
      const size_t k = r * sk_ + j;
      mag[k] = want[k] * (2.0 + std::fabs(static_cast<double>(c.scale) * x_.floats()[k]) + row_max);
    }
  }
  EXPECT_TRUE(AllClose(y.floats(), want, DType::kFloat32, mag));
}

TEST_P(ScaledSoftmaxTest, BackwardMatchesClosedForm) {
  const Case& c = GetParam();
  auto y_or = ScaledSoftmaxForward(Context::Cpu(), x_, c.scale, c.kind, mask_);
  ASSERT_TRUE(y_or.ok()) << y_or.status();
  const Tensor& y = *y_or;
  auto dx_or = ScaledSoftmaxBackward(Context::Cpu(), y, dy_, c.scale);
  ASSERT_TRUE(dx_or.ok()) << dx_or.status();
  const Tensor& dx = *dx_or;
  ASSERT_EQ(dx.shape(), c.shape);
  const auto yv = y.floats();
  const auto g = dy_.floats();
  std::vector<double> want(yv.size()), mag(yv.size());
  for (size_t r = 0; r * sk_ < yv.size(); ++r) {
    double dot = 0.0, dot_abs = 0.0;
    for (int64_t j = 0; j < sk_; ++j) {
      dot += static_cast<double>(g[r * sk_ + j]) * yv[r * sk_ + j];
      dot_abs += std::fabs(static_cast<double>(g[r * sk_ + j]) * yv[r * sk_ + j]);
    }
    for (int64_t j = 0; j < sk_; ++j) {
      const size_t k = r * sk_ + j;
      want[k] = c.scale * static_cast<double>(yv[k]) * (g[k] - dot);
      mag[k] = std::fabs(c.scale * static_cast<double>(yv[k])) * (std::fabs(g[k]) + dot_abs);
    }
  }
  EXPECT_TRUE(AllClose(dx.floats(), want, DType::kFloat32, mag));
}

// d/dx_k of L(x) = sum_m dy_m y_m(x), by central differences of the FP64 forward.
TEST_P(ScaledSoftmaxTest, BackwardMatchesFiniteDifferences) {
  const Case& c = GetParam();
  if (x_.numel() > 4096) GTEST_SKIP() << "finite differences run on the small shapes";
  auto y_or = ScaledSoftmaxForward(Context::Cpu(), x_, c.scale, c.kind, mask_);
  ASSERT_TRUE(y_or.ok()) << y_or.status();
  const Tensor& y = *y_or;
  auto dx_or = ScaledSoftmaxBackward(Context::Cpu(), y, dy_, c.scale);
  ASSERT_TRUE(dx_or.ok()) << dx_or.status();
  const Tensor& dx = *dx_or;
  const std::vector<double> x = XDoubles();
  auto loss = [&](const std::vector<double>& at) {
    const std::vector<double> out = ReferenceForward(c, mask_, at);
    double l = 0.0;
    for (size_t k = 0; k < out.size(); ++k) l += dy_.floats()[k] * out[k];
    return l;
  };
  const double h = 1e-4;
  std::vector<double> fd(x.size()), mag(x.size());
  for (size_t k = 0; k < x.size(); ++k) {
    std::vector<double> plus = x, minus = x;
    plus[k] += h;
    minus[k] -= h;
    fd[k] = (loss(plus) - loss(minus)) / (2 * h);
    // Rows' gradients are bounded by |scale| y_k (|dy_k| + max |dy|) <= 2 |scale| y_k.
    mag[k] = 4.0 * std::fabs(c.scale) * y.floats()[k] * (1.0 + std::fabs(c.scale * x[k]));
  }
  EXPECT_TRUE(AllClose(dx.floats(), fd, DType::kFloat32, mag));
}

TEST_P(ScaledSoftmaxTest, MaskedKeysAreZeroAndRowsSumToOne) {
  const Case& c = GetParam();
  auto y_or = ScaledSoftmaxForward(Context::Cpu(), x_, c.scale, c.kind, mask_);
  ASSERT_TRUE(y_or.ok()) << y_or.status();
  const Tensor& y = *y_or;
  auto dx_or = ScaledSoftmaxBackward(Context::Cpu(), y, dy_, c.scale);
  ASSERT_TRUE(dx_or.ok()) << dx_or.status();
  const Tensor& dx = *dx_or;
  const int64_t heads = c.shape[1], sq = c.shape[2];
  for (int64_t r = 0; r * sk_ < y.numel(); ++r) {
    const int64_t b = r / (heads * sq), i = r % sq;
    double sum = 0.0;
    int64_t visible = 0;
    for (int64_t j = 0; j < sk_; ++j) {
      const float v = y.floats()[r * sk_ + j];
      if (Visible(c, mask_, b, i, j)) {
        ++visible;
        sum += v;
        continue;
      }
      EXPECT_EQ(v, 0.0f) << "row " << r << " key " << j;
      EXPECT_EQ(dx.floats()[r * sk_ + j], 0.0f) << "row " << r << " key " << j;
    }
    // Fully masked rows are all zeros (no NaN); others sum to one.
    EXPECT_NEAR(sum, visible == 0 ? 0.0 : 1.0, 1e-5 * std::max<int64_t>(visible, 1)) << "row " << r;
  }
}

// Adding a constant to every score of a row leaves y unchanged (the max is subtracted):
// also at scores whose exp would overflow FP32.
TEST_P(ScaledSoftmaxTest, ShiftInvariantAtLargeScores) {
  const Case& c = GetParam();
  const float shift = 200.0f / std::fabs(c.scale);
  Tensor shifted = Tensor::Zeros(DType::kFloat32, c.shape).value();
  for (int64_t k = 0; k < x_.numel(); ++k) shifted.mutable_floats()[k] = x_.floats()[k] + shift;
  auto y_or = ScaledSoftmaxForward(Context::Cpu(), x_, c.scale, c.kind, mask_);
  ASSERT_TRUE(y_or.ok()) << y_or.status();
  const Tensor& y = *y_or;
  auto ys_or = ScaledSoftmaxForward(Context::Cpu(), shifted, c.scale, c.kind, mask_);
  ASSERT_TRUE(ys_or.ok()) << ys_or.status();
  const Tensor& ys = *ys_or;
  // The shifted scores are rounded at the shifted values' ulp (a score error of at most
  // about 3e-5 here), which moves y by that relative amount.
  for (int64_t k = 0; k < y.numel(); ++k) {
    ASSERT_TRUE(std::isfinite(ys.floats()[k])) << k;
    EXPECT_NEAR(ys.floats()[k], y.floats()[k], 1e-4 * y.floats()[k] + 1e-7) << k;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Variants, ScaledSoftmaxTest,
    ::testing::Values(Case{"plain_one_score", {1, 1, 1, 1}, 1.0f, SoftmaxMask::kNone, 3.0f},
                      Case{"plain_one_row", {1, 1, 1, 7}, 1.0f, SoftmaxMask::kNone, 3.0f},
                      Case{"plain_2x3x5x9_scale_eighth", {2, 3, 5, 9}, 0.125f, SoftmaxMask::kNone, 8.0f},
                      Case{"plain_negative_scale", {1, 2, 3, 4}, -0.5f, SoftmaxMask::kNone, 3.0f},
                      Case{"plain_257x259", {1, 1, 257, 259}, 0.0625f, SoftmaxMask::kNone, 16.0f},
                      Case{"padding_2x3x4x6", {2, 3, 4, 6}, 0.5f, SoftmaxMask::kPadding, 3.0f},
                      Case{"padding_1x2x17x33", {1, 2, 17, 33}, 1.0f, SoftmaxMask::kPadding, 2.0f},
                      Case{"causal_top_left_square", {2, 2, 5, 5}, 0.7f, SoftmaxMask::kCausalTopLeft, 3.0f},
                      Case{"causal_top_left_sq_lt_sk", {2, 1, 3, 7}, 1.0f, SoftmaxMask::kCausalTopLeft, 3.0f},
                      Case{"causal_top_left_sq_gt_sk", {1, 2, 7, 3}, 1.0f, SoftmaxMask::kCausalTopLeft, 3.0f},
                      Case{"causal_bottom_right_square", {1, 1, 6, 6}, 0.7f, SoftmaxMask::kCausalBottomRight,
                           3.0f},
                      Case{"causal_bottom_right_sq_lt_sk", {2, 2, 3, 7}, 1.0f, SoftmaxMask::kCausalBottomRight,
                           3.0f},
                      Case{"causal_bottom_right_sq_gt_sk_fully_masked_rows", {1, 2, 7, 3}, 1.0f,
                           SoftmaxMask::kCausalBottomRight, 3.0f},
                      Case{"causal_bottom_right_257x259", {1, 1, 257, 259}, 0.0625f,
                           SoftmaxMask::kCausalBottomRight, 16.0f}),
    [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

TEST(ScaledSoftmaxVariantsTest, CausalCornersDifferWhenSqLessThanSk) {
  // sq = 2, sk = 3, equal scores: top-left row 0 sees key 0 only; bottom-right row 0
  // sees keys 0 and 1.
  const Tensor x = Tensor::FromFloats({0, 0, 0, 0, 0, 0}, {1, 1, 2, 3}).value();
  auto tl_or = ScaledSoftmaxForward(Context::Cpu(), x, 1.0f, SoftmaxMask::kCausalTopLeft);
  ASSERT_TRUE(tl_or.ok()) << tl_or.status();
  const Tensor& tl = *tl_or;
  auto br_or = ScaledSoftmaxForward(Context::Cpu(), x, 1.0f, SoftmaxMask::kCausalBottomRight);
  ASSERT_TRUE(br_or.ok()) << br_or.status();
  const Tensor& br = *br_or;
  const std::vector<float> want_tl = {1, 0, 0, 0.5f, 0.5f, 0};
  const std::vector<float> want_br = {0.5f, 0.5f, 0, 1.0f / 3, 1.0f / 3, 1.0f / 3};
  for (int k = 0; k < 6; ++k) {
    EXPECT_FLOAT_EQ(tl.floats()[k], want_tl[k]) << k;
    EXPECT_FLOAT_EQ(br.floats()[k], want_br[k]) << k;
  }
}

TEST(ScaledSoftmaxErrorsTest, NamesTheArgument) {
  const Context cpu = Context::Cpu();
  const Tensor x = RandomTensor({2, 3, 4, 5}, -1.0f, 1.0f, 1);
  const Tensor mask = Tensor::Zeros(DType::kBool, {2, 1, 4, 5}).value();
  EXPECT_THAT(ScaledSoftmaxForward(cpu, RandomTensor({3, 4, 5}, -1.0f, 1.0f, 1), 1.0f, SoftmaxMask::kNone),
              HasError(absl::StatusCode::kInvalidArgument, "x.shape"));
  EXPECT_THAT(ScaledSoftmaxForward(cpu, Tensor::Zeros(DType::kInt32, {2, 3, 4, 5}).value(), 1.0f,
                                   SoftmaxMask::kNone),
              HasError(absl::StatusCode::kInvalidArgument, "x.dtype"));
  EXPECT_THAT(ScaledSoftmaxForward(cpu, x, NAN, SoftmaxMask::kNone),
              HasError(absl::StatusCode::kInvalidArgument, "scale"));
  EXPECT_THAT(ScaledSoftmaxForward(cpu, x, 1.0f, SoftmaxMask::kPadding),
              HasError(absl::StatusCode::kInvalidArgument, "mask"));
  EXPECT_THAT(ScaledSoftmaxForward(cpu, x, 1.0f, SoftmaxMask::kCausalTopLeft, mask),
              HasError(absl::StatusCode::kInvalidArgument, "no mask for kind causal_top_left"));
  EXPECT_THAT(ScaledSoftmaxForward(cpu, x, 1.0f, SoftmaxMask::kPadding,
                                   Tensor::Zeros(DType::kBool, {2, 3, 4, 5}).value()),
              HasError(absl::StatusCode::kInvalidArgument, "mask.shape"));
  EXPECT_THAT(ScaledSoftmaxForward(cpu, x, 1.0f, SoftmaxMask::kPadding,
                                   Tensor::Zeros(DType::kFloat32, {2, 1, 4, 5}).value()),
              HasError(absl::StatusCode::kInvalidArgument, "mask.dtype"));
  EXPECT_THAT(ScaledSoftmaxForward(cpu, x, 1.0f, static_cast<SoftmaxMask>(9)),
              HasError(absl::StatusCode::kInvalidArgument, "kind"));
  EXPECT_THAT(ScaledSoftmaxBackward(cpu, x, RandomTensor({2, 3, 4, 6}, -1.0f, 1.0f, 2), 1.0f),
              HasError(absl::StatusCode::kInvalidArgument, "dy.shape"));
  EXPECT_THAT(ScaledSoftmaxBackward(cpu, x, x, INFINITY), HasError(absl::StatusCode::kInvalidArgument, "scale"));
}

}  // namespace
}  // namespace kernels
}  // namespace teserve
