// Tests of kernels/normalization.h on the CPU: LayerNorm and RMSNorm over awkward
// shapes, with and without zero-centered gamma. Forward against the direct double
// formula; backward against an analytic double reference (the explicit Jacobian) and
// against central finite differences of the double forward formula; the extended entry
// points (FP16/BF16 inputs, y dtype, fused FP8 output) against the FP32 path and the
// float codec; metadata errors.
#include "kernels/normalization.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <ostream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "core/float_codec.h"
#include "gtest/gtest.h"
#include "kernels/cast.h"
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

// With CUDA compiled in, CUDA tensors run the kernels (tests/gpu/normalization/normalization_gpu_test.cc);
// without it, a CUDA context is refused naming the op, before any memory is touched.
TEST_F(NormErrors, CudaContextWithoutCudaBackendNamesTheOp) {
#if TESERVE_WITH_CUDA
  GTEST_SKIP() << "CUDA backend compiled in: CUDA tensors are covered by tests/gpu";
#else
  float storage[12] = {}, params[4] = {};
  Context cuda;
  cuda.device = Device::Cuda(0);
  const Tensor x = Tensor::Borrow(storage, DType::kFloat32, {3, 4}, Device::Cuda(0));
  const Tensor gamma = Tensor::Borrow(params, DType::kFloat32, {4}, Device::Cuda(0));
  EXPECT_THAT(RmsNormForward(cuda, x, gamma, kEps, false),
              HasError(absl::StatusCode::kUnimplemented,
                       "RmsNormForward has no kernel for cuda:0 (teserve was built without CUDA)"));
  EXPECT_THAT(NormalizationForward(cuda, NormType::kRmsNorm, x, gamma, Tensor(), NormForwardOptions()),
              HasError(absl::StatusCode::kUnimplemented, "NormalizationForward has no kernel for cuda:0"));
#endif
  const Tensor x_cuda = Tensor::Borrow(nullptr, DType::kFloat32, {3, 4}, Device::Cuda(0));
  EXPECT_THAT(RmsNormForward(ctx_, x_cuda, gamma_, kEps, false),
              HasError(kInvalid, "x.device: expected cpu, got cuda:0"));
}

// ---- Extended entry points: FP16/BF16 inputs, y dtype, fused per-tensor FP8 output. ----

Tensor Widened(const Tensor& t) { return ToFloat32(Context::Cpu(), t).value(); }

// The FP32 forward of the widened input is the reference for every extended forward.
struct ExtendedCase {
  NormType type;
  DType x_dtype;
  DType format;
};

std::string ExtendedCaseName(const ::testing::TestParamInfo<ExtendedCase>& info) {
  return absl::StrCat(info.param.type == NormType::kLayerNorm ? "LayerNorm" : "RmsNorm", "_",
                      DTypeName(info.param.x_dtype), "_", DTypeName(info.param.format));
}

class NormExtended : public ::testing::TestWithParam<ExtendedCase> {
 protected:
  void SetUp() override {
    x_ = CastFromFloat32(Context::Cpu(), RandomTensor({5, 67}, -2.0f, 3.0f, 21u), GetParam().x_dtype).value();
    gamma_ = RandomTensor({67}, 0.5f, 1.5f, 22u);
    beta_ = GetParam().type == NormType::kLayerNorm ? RandomTensor({67}, -1.0f, 1.0f, 23u) : Tensor();
  }
  bool layer_norm() const { return GetParam().type == NormType::kLayerNorm; }
  NormForwardOutputs Fp32Forward() const {
    const Tensor x32 = Widened(x_);
    return (layer_norm() ? LayerNormForward(Context::Cpu(), x32, gamma_, beta_, kEps, false)
                         : RmsNormForward(Context::Cpu(), x32, gamma_, kEps, false))
        .value();
  }
  Tensor x_, gamma_, beta_;
};

TEST_P(NormExtended, QuantizedOutputEncodesTheFp32NormalizedValues) {
  NormForwardOptions options;
  options.eps = kEps;
  options.quantize = true;
  options.quantize_options.format = GetParam().format;
  options.quantize_options.scale = 200.0f;  // |y| reaches ~3: E4M3 (max 448) saturates some
  options.quantize_options.columnwise = true;
  auto out = NormalizationForward(Context::Cpu(), GetParam().type, x_, gamma_, beta_, options);
  ASSERT_TRUE(out.ok()) << out.status();
  const NormForwardOutputs ref = Fp32Forward();
  const absl::Span<const float> y = ref.y.floats();
  // y in x's dtype by default: the FP32 values rounded once.
  ASSERT_EQ(out->y.dtype(), x_.dtype());
  EXPECT_TRUE(BitwiseEqual(out->y, CastFromFloat32(Context::Cpu(), ref.y, x_.dtype()).value()));
  EXPECT_TRUE(BitwiseEqual(out->rsigma, ref.rsigma));
  EXPECT_EQ(out->mu.defined(), layer_norm());
  const QuantizedTensor& q = out->fp8;
  ASSERT_TRUE(q.has_rowwise() && q.has_columnwise());
  EXPECT_EQ(q.rowwise_scale_inv.floats()[0], 1.0f / 200.0f);
  EXPECT_EQ(q.columnwise_scale_inv.floats()[0], 1.0f / 200.0f);
  float amax = 0.0f;
  int64_t saturated = 0;
  const bool e4m3 = GetParam().format == DType::kFloat8E4M3;
  for (int64_t r = 0; r < 5; ++r) {
    for (int64_t c = 0; c < 67; ++c) {
      const float v = y[r * 67 + c];
      amax = std::max(amax, std::fabs(v));
      const uint8_t want = e4m3 ? FloatToE4M3(v * 200.0f) : FloatToE5M2(v * 200.0f);
      ASSERT_EQ(q.rowwise_data.data<uint8_t>()[r * 67 + c], want) << r << "," << c;
      ASSERT_EQ(q.columnwise_data.data<uint8_t>()[c * 5 + r], want) << r << "," << c;
      if (std::fabs(v * 200.0f) > (e4m3 ? kE4M3Max : kE5M2Max)) ++saturated;
    }
  }
  EXPECT_EQ(q.amax, amax);
  if (e4m3) EXPECT_GT(saturated, 0) << "the scale should push some values past E4M3's range";
}

TEST_P(NormExtended, YDtypeAndSkippedY) {
  NormForwardOptions options;
  options.eps = kEps;
  options.y_dtype = DType::kFloat32;
  auto fp32_y = NormalizationForward(Context::Cpu(), GetParam().type, x_, gamma_, beta_, options);
  ASSERT_TRUE(fp32_y.ok()) << fp32_y.status();
  EXPECT_TRUE(BitwiseEqual(fp32_y->y, Fp32Forward().y));
  EXPECT_FALSE(fp32_y->fp8.has_rowwise());
  options.write_y = false;
  options.quantize = true;
  options.quantize_options.format = GetParam().format;
  auto no_y = NormalizationForward(Context::Cpu(), GetParam().type, x_, gamma_, beta_, options);
  ASSERT_TRUE(no_y.ok()) << no_y.status();
  EXPECT_FALSE(no_y->y.defined());
  EXPECT_TRUE(no_y->fp8.has_rowwise());
  EXPECT_FALSE(no_y->fp8.has_columnwise());
}

TEST_P(NormExtended, BackwardRoundsTheFp32GradientsToTheInputDtype) {
  const NormForwardOutputs fwd = Fp32Forward();
  const Tensor dy = CastFromFloat32(Context::Cpu(), RandomTensor({5, 67}, -1.0f, 1.0f, 24u), x_.dtype()).value();
  NormBackwardOptions options;
  auto out = NormalizationBackward(Context::Cpu(), GetParam().type, dy, x_, fwd.mu, fwd.rsigma, gamma_, options);
  ASSERT_TRUE(out.ok()) << out.status();
  auto ref = layer_norm() ? LayerNormBackward(Context::Cpu(), Widened(dy), Widened(x_), fwd.mu, fwd.rsigma, gamma_, false)
                          : RmsNormBackward(Context::Cpu(), Widened(dy), Widened(x_), fwd.rsigma, gamma_, false);
  ASSERT_TRUE(ref.ok()) << ref.status();
  ASSERT_EQ(out->dx.dtype(), x_.dtype());
  EXPECT_TRUE(BitwiseEqual(out->dx, CastFromFloat32(Context::Cpu(), ref->dx, x_.dtype()).value()));
  EXPECT_TRUE(BitwiseEqual(out->dgamma, ref->dgamma));
  EXPECT_EQ(out->dbeta.defined(), layer_norm());
}

INSTANTIATE_TEST_SUITE_P(Kernels, NormExtended,
                         ::testing::Values(ExtendedCase{NormType::kLayerNorm, DType::kBFloat16, DType::kFloat8E4M3},
                                           ExtendedCase{NormType::kLayerNorm, DType::kFloat16, DType::kFloat8E5M2},
                                           ExtendedCase{NormType::kLayerNorm, DType::kFloat32, DType::kFloat8E4M3},
                                           ExtendedCase{NormType::kRmsNorm, DType::kBFloat16, DType::kFloat8E5M2},
                                           ExtendedCase{NormType::kRmsNorm, DType::kFloat32, DType::kFloat8E4M3}),
                         ExtendedCaseName);

TEST_F(NormErrors, ExtendedForwardRejectsBadOptions) {
  const NormType ln = NormType::kLayerNorm;
  const NormType rms = NormType::kRmsNorm;
  NormForwardOptions options;
  EXPECT_THAT(NormalizationForward(ctx_, ln, Tensor::Zeros(DType::kInt32, {3, 4}).value(), gamma_, beta_, options),
              HasError(kInvalid, "x.dtype: expected one of FLOAT32, FLOAT16, BFLOAT16, got INT32"));
  EXPECT_THAT(NormalizationForward(ctx_, rms, x_, gamma_, beta_, options),
              HasError(kInvalid, "beta: expected no tensor for RMSNorm, got a tensor"));
  EXPECT_THAT(NormalizationForward(ctx_, ln, x_, gamma_, Tensor(), options),
              HasError(kInvalid, "beta: expected a tensor, got an undefined tensor"));
  options.y_dtype = DType::kFloat8E4M3;
  EXPECT_THAT(NormalizationForward(ctx_, ln, x_, gamma_, beta_, options),
              HasError(kInvalid, "options.y_dtype: expected one of FLOAT32, FLOAT16, BFLOAT16, got FLOAT8_E4M3"));
  options.y_dtype.reset();
  options.write_y = false;
  EXPECT_THAT(NormalizationForward(ctx_, ln, x_, gamma_, beta_, options),
              HasError(kInvalid,
                       "options.write_y: expected true when options.quantize and options.mxfp8 are "
                       "false, got false"));
  options.quantize = true;
  options.quantize_options.format = DType::kBFloat16;
  EXPECT_THAT(NormalizationForward(ctx_, ln, x_, gamma_, beta_, options),
              HasError(kInvalid, "options.quantize_options.format: expected FLOAT8_E4M3 or FLOAT8_E5M2, got BFLOAT16"));
  options.quantize_options.format = DType::kFloat8E4M3;
  options.quantize_options.scale = 0.0f;
  EXPECT_THAT(NormalizationForward(ctx_, ln, x_, gamma_, beta_, options),
              HasError(kInvalid, "options.quantize_options.scale: expected a finite positive value, got 0"));
  options.quantize_options.scale = 1.0f;
  options.quantize_options.rowwise = false;
  EXPECT_THAT(NormalizationForward(ctx_, ln, x_, gamma_, beta_, options),
              HasError(kInvalid, "options.quantize_options: expected rowwise and/or columnwise, got neither"));
  options.quantize_options.rowwise = true;
  options.sm_margin = -1;
  EXPECT_THAT(NormalizationForward(ctx_, ln, x_, gamma_, beta_, options),
              HasError(kInvalid, "options.sm_margin: expected >= 0, got -1"));
  options.sm_margin = 0;
  options.eps = -1.0f;
  EXPECT_THAT(NormalizationForward(ctx_, ln, x_, gamma_, beta_, options),
              HasError(kInvalid, "options.eps: expected a finite value >= 0"));
}

// ---- MXFP8 output: QuantizeMxfp8's block formula applied to the FP32 normalized values. ----

struct Mxfp8Case {
  NormType type;
  DType format;
  bool zero_centered;
};

std::string Mxfp8CaseName(const ::testing::TestParamInfo<Mxfp8Case>& info) {
  return absl::StrCat(info.param.type == NormType::kLayerNorm ? "LayerNorm" : "RmsNorm", "_",
                      DTypeName(info.param.format), info.param.zero_centered ? "_ZeroCentered" : "");
}

class NormMxfp8 : public ::testing::TestWithParam<Mxfp8Case> {};

// Expected copy of the FP32 values v [rows, cols] blocked along its rows (32 per block):
// code = E8M0 round-up of amax / fp8_max, data = encode(v * 2^(127 - code)).
void ExpectMxfp8Copy(const std::vector<float>& v, int64_t rows, int64_t cols, DType format,
                     const Tensor& data, const Tensor& scales, const std::string& what) {
  ASSERT_EQ(data.shape(), (Shape{rows, cols})) << what;
  ASSERT_EQ(scales.dtype(), DType::kFloat8E8M0) << what;
  ASSERT_EQ(scales.shape(), (Shape{rows, cols / 32})) << what;
  const float fp8_max = format == DType::kFloat8E4M3 ? kE4M3Max : kE5M2Max;
  int64_t wrong_codes = 0, wrong_data = 0;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t b = 0; b < cols / 32; ++b) {
      float amax = 0.0f;
      for (int64_t j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(v[r * cols + b * 32 + j]));
      const uint8_t code = FloatToE8M0RoundUp(amax / fp8_max);
      if (scales.data<uint8_t>()[r * (cols / 32) + b] != code) ++wrong_codes;
      const float scale = std::ldexp(1.0f, 127 - static_cast<int>(code));
      for (int64_t j = 0; j < 32; ++j) {
        const float s = v[r * cols + b * 32 + j] * scale;
        const uint8_t want = format == DType::kFloat8E4M3 ? FloatToE4M3(s) : FloatToE5M2(s);
        if (data.data<uint8_t>()[r * cols + b * 32 + j] != want) ++wrong_data;
      }
    }
  }
  EXPECT_EQ(wrong_codes, 0) << what;
  EXPECT_EQ(wrong_data, 0) << what;
}

TEST_P(NormMxfp8, CopiesAndE8M0ScalesFollowTheBlockFormulaOnTheFp32Output) {
  const Mxfp8Case& c = GetParam();
  const int64_t n = 64, h = 96;
  Tensor x32 = RandomTensor({n, h}, -2.0f, 3.0f, 41u);
  for (int64_t j = 0; j < h; ++j) x32.data<float>()[5 * h + j] *= 64.0f;  // a wide row
  const Tensor x = CastFromFloat32(Context::Cpu(), x32, DType::kBFloat16).value();
  const Tensor gamma = RandomTensor({h}, c.zero_centered ? -0.5f : 0.5f, c.zero_centered ? 0.5f : 1.5f, 42u);
  const Tensor beta = c.type == NormType::kLayerNorm ? RandomTensor({h}, -1.0f, 1.0f, 43u) : Tensor();
  NormForwardOptions plain;
  plain.eps = kEps;
  plain.zero_centered_gamma = c.zero_centered;
  plain.y_dtype = DType::kFloat32;
  const NormForwardResult fp32 = NormalizationForward(Context::Cpu(), c.type, x, gamma, beta, plain).value();
  const std::vector<float> y(fp32.y.data<float>(), fp32.y.data<float>() + n * h);
  std::vector<float> y_t(n * h);
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t j = 0; j < h; ++j) y_t[j * n + r] = y[r * h + j];
  }

  NormForwardOptions options = plain;
  options.y_dtype.reset();
  options.mxfp8 = true;
  options.mxfp8_options.format = c.format;
  options.mxfp8_options.rowwise = true;
  options.mxfp8_options.columnwise = true;
  const absl::StatusOr<NormForwardResult> result =
      NormalizationForward(Context::Cpu(), c.type, x, gamma, beta, options);
  ASSERT_TRUE(result.ok()) << result.status();
  const NormForwardResult& out = *result;
  EXPECT_EQ(out.fp8.mode, ScalingMode::kMxfp8_1D);
  ExpectMxfp8Copy(y, n, h, c.format, out.fp8.rowwise_data, out.fp8.rowwise_scale_inv, "rowwise");
  ExpectMxfp8Copy(y_t, h, n, c.format, out.fp8.columnwise_data, out.fp8.columnwise_scale_inv,
                  "columnwise");
  // y in x's dtype is the FP32 y rounded once; statistics as without quantization.
  ASSERT_EQ(out.y.dtype(), DType::kBFloat16);
  const Tensor rounded = CastFromFloat32(Context::Cpu(), fp32.y, DType::kBFloat16).value();
  EXPECT_EQ(0, std::memcmp(out.y.raw_data(), rounded.raw_data(), n * h * 2));
  EXPECT_EQ(0, std::memcmp(out.rsigma.raw_data(), fp32.rsigma.raw_data(), n * 4));

  options.write_y = false;
  options.mxfp8_options.columnwise = false;
  const absl::StatusOr<NormForwardResult> codes_result =
      NormalizationForward(Context::Cpu(), c.type, x, gamma, beta, options);
  ASSERT_TRUE(codes_result.ok()) << codes_result.status();
  const NormForwardResult& codes_only = *codes_result;
  EXPECT_FALSE(codes_only.y.defined());
  EXPECT_FALSE(codes_only.fp8.has_columnwise());
  EXPECT_EQ(0, std::memcmp(codes_only.fp8.rowwise_data.raw_data(), out.fp8.rowwise_data.raw_data(), n * h));
}

INSTANTIATE_TEST_SUITE_P(Kernels, NormMxfp8,
                         ::testing::Values(Mxfp8Case{NormType::kLayerNorm, DType::kFloat8E4M3, false},
                                           Mxfp8Case{NormType::kLayerNorm, DType::kFloat8E5M2, true},
                                           Mxfp8Case{NormType::kRmsNorm, DType::kFloat8E4M3, true},
                                           Mxfp8Case{NormType::kRmsNorm, DType::kFloat8E5M2, false}),
                         Mxfp8CaseName);

TEST_F(NormErrors, Mxfp8OptionsAndShapesAreChecked) {
  const NormType rms = NormType::kRmsNorm;
  NormForwardOptions options;
  options.mxfp8 = true;
  EXPECT_THAT(NormalizationForward(ctx_, rms, x_, gamma_, Tensor(), options),
              HasError(kInvalid, "x.shape[1]: expected a multiple of 32 for the rowwise MXFP8 copy, got 4"));
  const Tensor x = Filled({3, 32}, 1.0f), gamma = Filled({32}, 1.0f);
  options.mxfp8_options.columnwise = true;
  EXPECT_THAT(NormalizationForward(ctx_, rms, x, gamma, Tensor(), options),
              HasError(kInvalid, "x.shape[0]: expected a multiple of 32 for the columnwise MXFP8 copy, got 3"));
  options.mxfp8_options.columnwise = false;
  options.quantize = true;
  EXPECT_THAT(NormalizationForward(ctx_, rms, x, gamma, Tensor(), options),
              HasError(kInvalid, "options.mxfp8: expected false when options.quantize is set, got true"));
  options.quantize = false;
  options.mxfp8_options.format = DType::kFloat16;
  EXPECT_THAT(NormalizationForward(ctx_, rms, x, gamma, Tensor(), options),
              HasError(kInvalid, "options.mxfp8_options.format: expected FLOAT8_E4M3 or FLOAT8_E5M2, got FLOAT16"));
  options.mxfp8_options.format = DType::kFloat8E4M3;
  options.mxfp8_options.rowwise = false;
  EXPECT_THAT(NormalizationForward(ctx_, rms, x, gamma, Tensor(), options),
              HasError(kInvalid, "options.mxfp8_options: expected rowwise and/or columnwise, got neither"));
  options.mxfp8_options.rowwise = true;
  Tensor dbias = Filled({32}, 0.0f);
  options.mxfp8_options.dbias = &dbias;
  EXPECT_THAT(NormalizationForward(ctx_, rms, x, gamma, Tensor(), options),
              HasError(kInvalid, "options.mxfp8_options.dbias: expected null (no dbias of a norm output), got a tensor"));
}

TEST_F(NormErrors, ExtendedBackwardRejectsMismatches) {
  NormBackwardOptions options;
  const Tensor x_bf16 = Tensor::Zeros(DType::kBFloat16, {3, 4}).value();
  EXPECT_THAT(NormalizationBackward(ctx_, NormType::kLayerNorm, x_, x_bf16, stats_, stats_, gamma_, options),
              HasError(kInvalid, "dy.dtype: expected BFLOAT16, got FLOAT32"));
  EXPECT_THAT(NormalizationBackward(ctx_, NormType::kLayerNorm, Filled({4, 3}, 1.0f), x_, stats_, stats_, gamma_, options),
              HasError(kInvalid, "dy.shape: expected [3, 4], got [4, 3]"));
  EXPECT_THAT(NormalizationBackward(ctx_, NormType::kRmsNorm, x_, x_, stats_, stats_, gamma_, options),
              HasError(kInvalid, "mu: expected no tensor for RMSNorm, got a tensor"));
  EXPECT_THAT(NormalizationBackward(ctx_, NormType::kLayerNorm, x_, x_, Tensor(), stats_, gamma_, options),
              HasError(kInvalid, "mu: expected a tensor, got an undefined tensor"));
  options.sm_margin = -3;
  EXPECT_THAT(NormalizationBackward(ctx_, NormType::kRmsNorm, x_, x_, Tensor(), stats_, gamma_, options),
              HasError(kInvalid, "options.sm_margin: expected >= 0, got -3"));
}

}  // namespace
}  // namespace kernels
}  // namespace teserve
