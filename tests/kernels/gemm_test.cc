// Tests of kernels/gemm.h on the CPU: Gemm against a naive double-precision triple
// loop for all four transpose combinations over awkward shapes, alpha/beta, empty
// dimensions, Linear's three GEMMs, the bias helpers and metadata errors.
#include "kernels/gemm.h"

#include <cmath>
#include <limits>
#include <ostream>
#include <string>
#include <tuple>
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

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;

struct GemmShape {
  int64_t m, n, k;
};

void PrintTo(const GemmShape& s, std::ostream* os) { *os << "m=" << s.m << " n=" << s.n << " k=" << s.k; }

Tensor Filled(Shape shape, float value) {
  Tensor t = Tensor::Zeros(DType::kFloat32, std::move(shape)).value();
  for (float& v : t.mutable_floats()) v = value;
  return t;
}

// alpha * op(a) op(b) + beta * c0 in double, and the magnitude of its terms
// (|alpha| sum |a b| + |beta c0|) for the tolerance check.
struct Reference {
  std::vector<double> value;
  std::vector<double> magnitude;
};

Reference NaiveGemm(const Tensor& a, bool ta, const Tensor& b, bool tb, float alpha, float beta,
                    const Tensor& c0, GemmShape s) {
  Reference ref{std::vector<double>(s.m * s.n), std::vector<double>(s.m * s.n)};
  const float* pa = a.data<float>();
  const float* pb = b.data<float>();
  for (int64_t i = 0; i < s.m; ++i) {
    for (int64_t j = 0; j < s.n; ++j) {
      double sum = 0.0, mag = 0.0;
      for (int64_t p = 0; p < s.k; ++p) {
        const double av = ta ? pa[p * s.m + i] : pa[i * s.k + p];
        const double bv = tb ? pb[j * s.k + p] : pb[p * s.n + j];
        sum += av * bv;
        mag += std::fabs(av * bv);
      }
      const double cv = beta == 0.0f ? 0.0 : static_cast<double>(beta) * c0.data<float>()[i * s.n + j];
      ref.value[i * s.n + j] = alpha * sum + cv;
      ref.magnitude[i * s.n + j] = std::fabs(alpha) * mag + std::fabs(cv);
    }
  }
  return ref;
}

using GemmParam = std::tuple<GemmShape, bool, bool>;

std::string GemmName(const ::testing::TestParamInfo<GemmParam>& info) {
  const GemmShape s = std::get<0>(info.param);
  return absl::StrCat("M", s.m, "_N", s.n, "_K", s.k, "_", std::get<1>(info.param) ? "T" : "N",
                      std::get<2>(info.param) ? "T" : "N");
}

class GemmShapes : public ::testing::TestWithParam<GemmParam> {
 protected:
  GemmShape shape() const { return std::get<0>(GetParam()); }
  bool ta() const { return std::get<1>(GetParam()); }
  bool tb() const { return std::get<2>(GetParam()); }
  Tensor A() const {
    const GemmShape s = shape();
    return RandomTensor(ta() ? Shape{s.k, s.m} : Shape{s.m, s.k}, -1.0f, 1.0f, 1u);
  }
  Tensor B() const {
    const GemmShape s = shape();
    return RandomTensor(tb() ? Shape{s.n, s.k} : Shape{s.k, s.n}, -1.0f, 1.0f, 2u);
  }
  void CheckAgainstReference(float alpha, float beta, const Tensor& c0) const {
    const Tensor a = A(), b = B();
    Tensor c = c0.Clone().value();
    ASSERT_TRUE(Gemm(Context::Cpu(), a, ta(), b, tb(), alpha, beta, &c).ok());
    const Reference ref = NaiveGemm(a, ta(), b, tb(), alpha, beta, c0, shape());
    EXPECT_TRUE(AllClose(c.floats(), ref.value, DType::kFloat32, ref.magnitude));
  }
};

TEST_P(GemmShapes, MatchesDoubleReferenceIgnoringNaNInCWhenBetaIsZero) {
  CheckAgainstReference(1.0f, 0.0f, Filled({shape().m, shape().n}, kNaN));
}

TEST_P(GemmShapes, AppliesAlphaAndBeta) {
  CheckAgainstReference(0.75f, -1.5f, RandomTensor({shape().m, shape().n}, -2.0f, 2.0f, 3u));
}

INSTANTIATE_TEST_SUITE_P(
    Kernels, GemmShapes,
    ::testing::Combine(::testing::Values(GemmShape{1, 1, 1}, GemmShape{3, 37, 23},
                                         GemmShape{257, 259, 67}, GemmShape{64, 128, 256},
                                         GemmShape{16, 1, 300}, GemmShape{1, 300, 16},
                                         GemmShape{0, 5, 3}, GemmShape{4, 0, 3}),
                       ::testing::Bool(), ::testing::Bool()),
    GemmName);

TEST(Gemm, EmptyReductionScalesC) {
  const Tensor a = Tensor::Zeros(DType::kFloat32, {3, 0}).value();
  const Tensor b = Tensor::Zeros(DType::kFloat32, {0, 2}).value();
  Tensor c = Tensor::FromFloats({1, 2, 3, 4, 5, 6}, {3, 2}).value();
  ASSERT_TRUE(Gemm(Context::Cpu(), a, false, b, false, 2.0f, 0.5f, &c).ok());
  EXPECT_THAT(c.floats(), ::testing::ElementsAre(0.5f, 1.0f, 1.5f, 2.0f, 2.5f, 3.0f));
}

TEST(Gemm, EmptyReductionWithZeroBetaClearsNaN) {
  const Tensor a = Tensor::Zeros(DType::kFloat32, {0, 3}).value();  // transposed: [m=3, k=0]
  const Tensor b = Tensor::Zeros(DType::kFloat32, {2, 0}).value();  // transposed: [k=0, n=2]
  Tensor c = Filled({3, 2}, kNaN);
  ASSERT_TRUE(Gemm(Context::Cpu(), a, true, b, true, 1.0f, 0.0f, &c).ok());
  EXPECT_THAT(c.floats(), ::testing::Each(0.0f));
}

// Linear: y = x W^T (fprop), dx = dy W (dgrad), dW = dy^T x (wgrad), on small integers
// so every product is exact.
TEST(Gemm, LinearConventions) {
  const Tensor x = Tensor::FromFloats({1, 2, 3, 4, 5, 6}, {2, 3}).value();       // [batch, in]
  const Tensor w = Tensor::FromFloats({1, 0, -1, 2, 1, 0}, {2, 3}).value();      // [out, in]
  Tensor y = Tensor::Zeros(DType::kFloat32, {2, 2}).value();
  ASSERT_TRUE(Gemm(Context::Cpu(), x, false, w, true, 1.0f, 0.0f, &y).ok());
  EXPECT_THAT(y.floats(), ::testing::ElementsAre(-2, 4, -2, 13));
  const Tensor dy = Tensor::FromFloats({1, 1, 0, 2}, {2, 2}).value();            // [batch, out]
  Tensor dx = Tensor::Zeros(DType::kFloat32, {2, 3}).value();
  ASSERT_TRUE(Gemm(Context::Cpu(), dy, false, w, false, 1.0f, 0.0f, &dx).ok());
  EXPECT_THAT(dx.floats(), ::testing::ElementsAre(3, 1, -1, 4, 2, 0));
  Tensor dw = Tensor::Zeros(DType::kFloat32, {2, 3}).value();
  ASSERT_TRUE(Gemm(Context::Cpu(), dy, true, x, false, 1.0f, 0.0f, &dw).ok());
  EXPECT_THAT(dw.floats(), ::testing::ElementsAre(1, 2, 3, 9, 12, 15));
}

TEST(AddBias, AddsToEveryRow) {
  Tensor y = Tensor::FromFloats({1, 2, 3, 4, 5, 6}, {2, 3}).value();
  const Tensor bias = Tensor::FromFloats({10, 20, 30}, {3}).value();
  ASSERT_TRUE(AddBias(Context::Cpu(), bias, &y).ok());
  EXPECT_THAT(y.floats(), ::testing::ElementsAre(11, 22, 33, 14, 25, 36));
}

TEST(ColumnSum, SumsOrAccumulatesColumns) {
  const Tensor x = RandomTensor({257, 37}, -1.0f, 1.0f, 9u);
  std::vector<double> want(37, 0.0), magnitude(37, 0.0);
  for (int64_t i = 0; i < 257; ++i) {
    for (int64_t j = 0; j < 37; ++j) {
      want[j] += x.floats()[i * 37 + j];
      magnitude[j] += std::fabs(x.floats()[i * 37 + j]);
    }
  }
  Tensor out = Filled({37}, 100.0f);
  ASSERT_TRUE(ColumnSum(Context::Cpu(), x, /*accumulate=*/false, &out).ok());
  EXPECT_TRUE(AllClose(out.floats(), want, DType::kFloat32, magnitude));
  ASSERT_TRUE(ColumnSum(Context::Cpu(), x, /*accumulate=*/true, &out).ok());
  for (int64_t j = 0; j < 37; ++j) {
    want[j] *= 2;
    magnitude[j] *= 2;
  }
  EXPECT_TRUE(AllClose(out.floats(), want, DType::kFloat32, magnitude));
}

TEST(ColumnSum, OfNoRowsIsZero) {
  const Tensor x = Tensor::Zeros(DType::kFloat32, {0, 4}).value();
  Tensor out = Filled({4}, 7.0f);
  ASSERT_TRUE(ColumnSum(Context::Cpu(), x, /*accumulate=*/false, &out).ok());
  EXPECT_THAT(out.floats(), ::testing::Each(0.0f));
}

// ---- Metadata errors name the argument and say expected vs got. ----

TEST(GemmErrors, RejectsMismatchedReductionDimension) {
  const Tensor a = Tensor::Zeros(DType::kFloat32, {3, 5}).value();
  const Tensor b = Tensor::Zeros(DType::kFloat32, {4, 6}).value();
  Tensor c = Tensor::Zeros(DType::kFloat32, {3, 6}).value();
  EXPECT_THAT(Gemm(Context::Cpu(), a, false, b, false, 1.0f, 0.0f, &c),
              HasError(kInvalid, "b.shape: expected op(b) with 5 rows"));
}

TEST(GemmErrors, RejectsWrongOutputShape) {
  const Tensor a = Tensor::Zeros(DType::kFloat32, {5, 3}).value();  // transposed: [3, 5]
  const Tensor b = Tensor::Zeros(DType::kFloat32, {5, 6}).value();
  Tensor c = Tensor::Zeros(DType::kFloat32, {5, 6}).value();
  EXPECT_THAT(Gemm(Context::Cpu(), a, true, b, false, 1.0f, 0.0f, &c),
              HasError(kInvalid, "c.shape: expected [3, 6], got [5, 6]"));
}

TEST(GemmErrors, RejectsWrongDtypeRankAndMissingOutput) {
  const Tensor half = Tensor::Zeros(DType::kFloat16, {2, 2}).value();
  const Tensor ok = Tensor::Zeros(DType::kFloat32, {2, 2}).value();
  const Tensor rank3 = Tensor::Zeros(DType::kFloat32, {2, 2, 2}).value();
  Tensor c = Tensor::Zeros(DType::kFloat32, {2, 2}).value();
  EXPECT_THAT(Gemm(Context::Cpu(), half, false, ok, false, 1.0f, 0.0f, &c),
              HasError(kInvalid, "a.dtype: expected FLOAT32, got FLOAT16"));
  EXPECT_THAT(Gemm(Context::Cpu(), ok, false, rank3, false, 1.0f, 0.0f, &c),
              HasError(kInvalid, "b.shape: expected rank 2, got [2, 2, 2]"));
  EXPECT_THAT(Gemm(Context::Cpu(), ok, false, ok, false, 1.0f, 0.0f, nullptr),
              HasError(kInvalid, "c: expected an allocated output tensor"));
  Tensor aliased = ok;
  EXPECT_THAT(Gemm(Context::Cpu(), ok, false, c, false, 1.0f, 0.0f, &aliased),
              HasError(kInvalid, "c: expected a buffer distinct from a and b"));
}

TEST(GemmErrors, BiasHelpersCheckShapes) {
  Tensor y = Tensor::Zeros(DType::kFloat32, {2, 3}).value();
  const Tensor bias = Tensor::Zeros(DType::kFloat32, {4}).value();
  EXPECT_THAT(AddBias(Context::Cpu(), bias, &y), HasError(kInvalid, "bias.shape: expected [3], got [4]"));
  Tensor out = Tensor::Zeros(DType::kFloat32, {2}).value();
  EXPECT_THAT(ColumnSum(Context::Cpu(), y, false, &out),
              HasError(kInvalid, "out.shape: expected [3], got [2]"));
  const Tensor bias2d = Tensor::Zeros(DType::kFloat32, {1, 3}).value();
  EXPECT_THAT(AddBias(Context::Cpu(), bias2d, &y), HasError(kInvalid, "bias.shape: expected rank 1"));
}

TEST(GemmErrors, CudaTensorsNeedTheCudaBackendAndACudaContext) {
  float storage[4] = {};
  const Tensor a = Tensor::Borrow(storage, DType::kFloat32, {2, 2}, Device::Cuda(0));
  float other[4] = {};
  Tensor c = Tensor::Borrow(other, DType::kFloat32, {2, 2}, Device::Cuda(0));
  Context ctx;
  ctx.device = Device::Cuda(0);
#if !TESERVE_WITH_CUDA
  EXPECT_THAT(Gemm(ctx, a, false, a, false, 1.0f, 0.0f, &c),
              HasError(absl::StatusCode::kUnimplemented,
                       "Gemm has no kernel for cuda:0 (teserve was built without CUDA)"));
#endif
  EXPECT_THAT(Gemm(Context::Cpu(), a, false, a, false, 1.0f, 0.0f, &c),
              HasError(kInvalid, "a.device: expected cpu, got cuda:0"));
}

}  // namespace
}  // namespace kernels
}  // namespace teserve
