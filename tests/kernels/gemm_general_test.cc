// Tests of kernels/gemm.h's general GEMM on the CPU (the reference of the cuBLASLt
// path): FP8 operands read with their scale_inv, 16-bit operands, FP8 output with
// d_scale and amax, every epilogue against a double-precision composition, and the
// metadata errors (each names the field and says expected vs got).
#include <cmath>
#include <vector>

#include "core/dtype.h"
#include "core/float_codec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cast.h"
#include "kernels/gemm.h"
#include "tests/kernels/test_util.h"
#include "tests/kernels/tolerances.h"

namespace teserve {
namespace kernels {
namespace {

using ::teserve::testing_kernels::AllClose;
using ::teserve::testing_kernels::HasError;
using ::teserve::testing_kernels::RandomTensor;

constexpr absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;

Tensor Scalar(float value) { return Tensor::FromFloats({value}, {1}).value(); }

Tensor Cast(const Tensor& x, DType dtype) { return CastFromFloat32(Context::Cpu(), x, dtype).value(); }

std::vector<double> Decoded(const Tensor& t, double scale = 1.0) {
  const Tensor wide = ToFloat32(Context::Cpu(), t).value();
  std::vector<double> out;
  for (float v : wide.floats()) out.push_back(v * scale);
  return out;
}

// op(A) [m, k] as doubles, row-major.
std::vector<double> OpValues(const std::vector<double>& stored, int64_t rows, int64_t cols, bool transpose) {
  if (!transpose) return stored;
  std::vector<double> out(stored.size());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) out[c * rows + r] = stored[r * cols + c];
  }
  return out;
}

struct Product {
  std::vector<double> value;      // op(A) op(B)
  std::vector<double> magnitude;  // |op(A)| |op(B)|
};

Product Multiply(const std::vector<double>& a, const std::vector<double>& b, int64_t m, int64_t n, int64_t k) {
  Product p{std::vector<double>(m * n), std::vector<double>(m * n)};
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      for (int64_t l = 0; l < k; ++l) {
        p.value[i * n + j] += a[i * k + l] * b[l * n + j];
        p.magnitude[i * n + j] += std::fabs(a[i * k + l] * b[l * n + j]);
      }
    }
  }
  return p;
}

double Gelu(double x) { return 0.5 * x * (1.0 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))); }
double GeluGrad(double x) {
  const double u = 0.7978845608028654 * (x + 0.044715 * x * x * x);
  const double t = std::tanh(u);
  return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * 0.7978845608028654 * (1.0 + 3.0 * 0.044715 * x * x);
}

TEST(GemmGeneral, Fp8OperandsAreReadWithTheirScaleInv) {
  const int64_t m = 24, n = 40, k = 32;
  const Tensor a_q = Cast(RandomTensor({m, k}, -8.0f, 8.0f, 1), DType::kFloat8E4M3);
  const Tensor b_q = Cast(RandomTensor({n, k}, -8.0f, 8.0f, 2), DType::kFloat8E5M2);
  GemmOperand a{a_q, false, Scalar(0.5f)};
  GemmOperand b{b_q, true, Scalar(0.125f)};
  Tensor d = Tensor::Zeros(DType::kFloat32, {m, n}).value();
  ASSERT_OK(Gemm(Context::Cpu(), a, b, &d));

  const Product p = Multiply(Decoded(a_q, 0.5), OpValues(Decoded(b_q, 0.125), n, k, true), m, n, k);
  EXPECT_TRUE(AllClose(d.floats(), p.value, DType::kFloat32, p.magnitude));
}

TEST(GemmGeneral, Bf16OperandsAndOutputRoundOnce) {
  const int64_t m = 17, n = 9, k = 33;
  const Tensor a_h = Cast(RandomTensor({k, m}, -1.0f, 1.0f, 3), DType::kBFloat16);
  const Tensor b_h = Cast(RandomTensor({k, n}, -1.0f, 1.0f, 4), DType::kBFloat16);
  Tensor d = Tensor::Zeros(DType::kBFloat16, {m, n}).value();
  ASSERT_OK(Gemm(Context::Cpu(), GemmOperand{a_h, true}, GemmOperand{b_h, false}, &d));
  const Product p = Multiply(OpValues(Decoded(a_h), k, m, true), Decoded(b_h), m, n, k);
  const std::vector<double> got = Decoded(d);
  EXPECT_TRUE(AllClose(std::vector<float>(got.begin(), got.end()), p.value, DType::kBFloat16, p.magnitude));
}

TEST(GemmGeneral, Fp8OutputIsScaledAndItsAmaxTakenBeforeScaling) {
  const int64_t m = 16, n = 16, k = 16;
  const Tensor a_q = Cast(RandomTensor({m, k}, -2.0f, 2.0f, 5), DType::kFloat8E4M3);
  const Tensor b_q = Cast(RandomTensor({n, k}, -2.0f, 2.0f, 6), DType::kFloat8E4M3);
  const Tensor d_scale = Scalar(4.0f);
  Tensor amax = Scalar(-1.0f);
  Tensor d = Tensor::Zeros(DType::kFloat8E4M3, {m, n}).value();
  GemmOptions options;
  options.d_scale = &d_scale;
  options.d_amax = &amax;
  ASSERT_OK(Gemm(Context::Cpu(), GemmOperand{a_q, false, Scalar(1.0f)}, GemmOperand{b_q, true, Scalar(1.0f)},
                 &d, options));

  const Product p = Multiply(Decoded(a_q), OpValues(Decoded(b_q), n, k, true), m, n, k);
  double want_amax = 0.0;
  for (double v : p.value) want_amax = std::max(want_amax, std::fabs(v));
  EXPECT_NEAR(amax.floats()[0], want_amax, 1e-5 * want_amax);
  const std::vector<double> got = Decoded(d);
  for (size_t i = 0; i < got.size(); ++i) {
    const double want = std::min(448.0, std::max(-448.0, p.value[i] * 4.0));
    EXPECT_NEAR(got[i], want, 0.0625 * std::fabs(want) + 1e-2) << "at " << i;
  }
}

TEST(GemmGeneral, BiasAndGeluAuxBiasEpilogues) {
  const int64_t m = 12, n = 20, k = 16;
  const Tensor a_f = RandomTensor({m, k}, -1.0f, 1.0f, 7);
  const Tensor b_f = RandomTensor({n, k}, -1.0f, 1.0f, 8);
  const Tensor bias = RandomTensor({n}, -1.0f, 1.0f, 9);
  const Product p = Multiply(Decoded(a_f), OpValues(Decoded(b_f), n, k, true), m, n, k);
  std::vector<double> pre(m * n), post(m * n), magnitude(m * n);
  for (int64_t i = 0; i < m * n; ++i) {
    pre[i] = p.value[i] + bias.floats()[i % n];
    post[i] = Gelu(pre[i]);
    magnitude[i] = p.magnitude[i] + std::fabs(bias.floats()[i % n]);
  }

  Tensor d = Tensor::Zeros(DType::kFloat32, {m, n}).value();
  GemmOptions with_bias;
  with_bias.epilogue = GemmEpilogue::kBias;
  with_bias.bias = &bias;
  ASSERT_OK(Gemm(Context::Cpu(), GemmOperand{a_f}, GemmOperand{b_f, true}, &d, with_bias));
  EXPECT_TRUE(AllClose(d.floats(), pre, DType::kFloat32, magnitude));

  Tensor aux = Tensor::Zeros(DType::kFloat32, {m, n}).value();
  GemmOptions gelu;
  gelu.epilogue = GemmEpilogue::kGeluAuxBias;
  gelu.bias = &bias;
  gelu.aux = &aux;
  ASSERT_OK(Gemm(Context::Cpu(), GemmOperand{a_f}, GemmOperand{b_f, true}, &d, gelu));
  EXPECT_TRUE(AllClose(aux.floats(), pre, DType::kFloat32, magnitude));
  EXPECT_TRUE(AllClose(d.floats(), post, DType::kFloat32, magnitude));
}

TEST(GemmGeneral, DGeluBGradAndBGradBEpilogues) {
  const int64_t m = 10, n = 14, k = 16;
  const Tensor a_f = RandomTensor({m, k}, -1.0f, 1.0f, 10);
  const Tensor b_f = RandomTensor({k, n}, -1.0f, 1.0f, 11);
  Tensor aux = RandomTensor({m, n}, -2.0f, 2.0f, 12);
  const Product p = Multiply(Decoded(a_f), Decoded(b_f), m, n, k);
  std::vector<double> want(m * n), want_bgrad(n, 0.0), bgrad_magnitude(n, 0.0), magnitude(m * n);
  for (int64_t i = 0; i < m * n; ++i) {
    const double g = GeluGrad(aux.floats()[i]);
    want[i] = p.value[i] * g;
    magnitude[i] = p.magnitude[i] * std::fabs(g);
    want_bgrad[i % n] += want[i];
    bgrad_magnitude[i % n] += magnitude[i];
  }
  Tensor d = Tensor::Zeros(DType::kFloat32, {m, n}).value();
  Tensor bgrad = Tensor::Zeros(DType::kFloat32, {n}).value();
  GemmOptions dgelu;
  dgelu.epilogue = GemmEpilogue::kDGeluBGrad;
  dgelu.aux = &aux;
  dgelu.bias_grad = &bgrad;
  ASSERT_OK(Gemm(Context::Cpu(), GemmOperand{a_f}, GemmOperand{b_f}, &d, dgelu));
  EXPECT_TRUE(AllClose(d.floats(), want, DType::kFloat32, magnitude));
  EXPECT_TRUE(AllClose(bgrad.floats(), want_bgrad, DType::kFloat32, bgrad_magnitude));

  // wgrad with the bias gradient of dy: dW [m, n] = dy^T x with dy stored [k, m].
  const Tensor dy = RandomTensor({k, m}, -1.0f, 1.0f, 13);
  Tensor dbias = Tensor::Zeros(DType::kFloat32, {m}).value();
  GemmOptions bgradb;
  bgradb.epilogue = GemmEpilogue::kBGradB;
  bgradb.bias_grad = &dbias;
  ASSERT_OK(Gemm(Context::Cpu(), GemmOperand{dy, true}, GemmOperand{b_f}, &d, bgradb));
  std::vector<double> want_dbias(m, 0.0), dbias_magnitude(m, 0.0);
  for (int64_t l = 0; l < k; ++l) {
    for (int64_t i = 0; i < m; ++i) {
      want_dbias[i] += dy.floats()[l * m + i];
      dbias_magnitude[i] += std::fabs(dy.floats()[l * m + i]);
    }
  }
  EXPECT_TRUE(AllClose(dbias.floats(), want_dbias, DType::kFloat32, dbias_magnitude));
}

TEST(GemmGeneral, RejectsFp8RowsThatAreNotMultiplesOf16) {
  const Tensor a_q = Cast(RandomTensor({8, 40}, -1.0f, 1.0f, 14), DType::kFloat8E4M3);
  const Tensor b_q = Cast(RandomTensor({8, 40}, -1.0f, 1.0f, 15), DType::kFloat8E4M3);
  Tensor d = Tensor::Zeros(DType::kFloat32, {8, 8}).value();
  EXPECT_THAT(Gemm(Context::Cpu(), GemmOperand{a_q, false, Scalar(1.0f)}, GemmOperand{b_q, true, Scalar(1.0f)}, &d),
              HasError(kInvalid, "a.data.shape[1]: expected a multiple of 16"));
}

TEST(GemmGeneral, RejectsFp8LayoutsOtherThanTn) {
  const Tensor a_q = Cast(RandomTensor({16, 16}, -1.0f, 1.0f, 16), DType::kFloat8E4M3);
  Tensor d = Tensor::Zeros(DType::kFloat32, {16, 16}).value();
  EXPECT_THAT(Gemm(Context::Cpu(), GemmOperand{a_q, true, Scalar(1.0f)}, GemmOperand{a_q, true, Scalar(1.0f)}, &d),
              HasError(kInvalid, "a.transpose / b.transpose"));
}

TEST(GemmGeneral, RejectsE5M2TimesE5M2AndMixedPrecision) {
  const Tensor e5 = Cast(RandomTensor({16, 16}, -1.0f, 1.0f, 17), DType::kFloat8E5M2);
  const Tensor bf = Cast(RandomTensor({16, 16}, -1.0f, 1.0f, 18), DType::kBFloat16);
  Tensor d = Tensor::Zeros(DType::kFloat32, {16, 16}).value();
  EXPECT_THAT(Gemm(Context::Cpu(), GemmOperand{e5, false, Scalar(1.0f)}, GemmOperand{e5, true, Scalar(1.0f)}, &d),
              HasError(kInvalid, "E5M2 x E5M2"));
  EXPECT_THAT(Gemm(Context::Cpu(), GemmOperand{e5, false, Scalar(1.0f)}, GemmOperand{bf, true}, &d),
              HasError(kInvalid, "b.data.dtype"));
}

TEST(GemmGeneral, RejectsAnE5M2OutputOfE4M3Operands) {
  const Tensor e4 = Cast(RandomTensor({16, 16}, -1.0f, 1.0f, 23), DType::kFloat8E4M3);
  Tensor d = Tensor::Zeros(DType::kFloat8E5M2, {16, 16}).value();
  const Tensor d_scale = Scalar(1.0f);
  GemmOptions options;
  options.d_scale = &d_scale;
  EXPECT_THAT(Gemm(Context::Cpu(), GemmOperand{e4, false, Scalar(1.0f)}, GemmOperand{e4, true, Scalar(1.0f)}, &d,
                   options),
              HasError(kInvalid, "d.dtype: expected FLOAT8_E4M3 or a high-precision type for E4M3 x E4M3"));
}

TEST(GemmGeneral, RejectsAnEpilogueOnAnEmptyProductAndFp8Vectors) {
  const Tensor empty_k = Tensor::Zeros(DType::kFloat32, {4, 0}).value();
  Tensor d = Tensor::Zeros(DType::kFloat32, {4, 4}).value();
  const Tensor bias = RandomTensor({4}, -1.0f, 1.0f, 24);
  GemmOptions with_bias;
  with_bias.epilogue = GemmEpilogue::kBias;
  with_bias.bias = &bias;
  EXPECT_THAT(Gemm(Context::Cpu(), GemmOperand{empty_k}, GemmOperand{empty_k, true}, &d, with_bias),
              HasError(kInvalid, "options.epilogue: expected no epilogue and no d_amax for an empty product"));
  ASSERT_OK(Gemm(Context::Cpu(), GemmOperand{empty_k}, GemmOperand{empty_k, true}, &d));  // D = 0

  const Tensor e4 = Cast(RandomTensor({16, 16}, -1.0f, 1.0f, 25), DType::kFloat8E4M3);
  Tensor d8 = Tensor::Zeros(DType::kFloat8E4M3, {16, 16}).value();
  const Tensor d_scale = Scalar(1.0f);
  const Tensor fp8_bias = Cast(RandomTensor({16}, -1.0f, 1.0f, 26), DType::kFloat8E4M3);
  GemmOptions fp8;
  fp8.d_scale = &d_scale;
  fp8.epilogue = GemmEpilogue::kBias;
  fp8.bias = &fp8_bias;
  EXPECT_THAT(Gemm(Context::Cpu(), GemmOperand{e4, false, Scalar(1.0f)}, GemmOperand{e4, true, Scalar(1.0f)}, &d8, fp8),
              HasError(kInvalid, "options.bias.dtype: expected FLOAT32 or BFLOAT16"));
}

TEST(GemmGeneral, RejectsMissingScalesAndMisplacedEpilogueTensors) {
  const Tensor e4 = Cast(RandomTensor({16, 16}, -1.0f, 1.0f, 19), DType::kFloat8E4M3);
  const Tensor f = RandomTensor({16, 16}, -1.0f, 1.0f, 20);
  Tensor d = Tensor::Zeros(DType::kFloat32, {16, 16}).value();
  EXPECT_THAT(Gemm(Context::Cpu(), GemmOperand{e4, false}, GemmOperand{e4, true, Scalar(1.0f)}, &d),
              HasError(kInvalid, "a.scale_inv"));
  Tensor d8 = Tensor::Zeros(DType::kFloat8E4M3, {16, 16}).value();
  EXPECT_THAT(Gemm(Context::Cpu(), GemmOperand{e4, false, Scalar(1.0f)}, GemmOperand{e4, true, Scalar(1.0f)}, &d8),
              HasError(kInvalid, "options.d_scale"));
  const Tensor short_bias = RandomTensor({3}, -1.0f, 1.0f, 21);
  GemmOptions bias;
  bias.epilogue = GemmEpilogue::kBias;
  bias.bias = &short_bias;
  EXPECT_THAT(Gemm(Context::Cpu(), GemmOperand{f}, GemmOperand{f}, &d, bias), HasError(kInvalid, "options.bias"));
  GemmOptions stray;
  stray.bias = &short_bias;
  EXPECT_THAT(Gemm(Context::Cpu(), GemmOperand{f}, GemmOperand{f}, &d, stray),
              HasError(kInvalid, "options.bias: expected nullptr for this epilogue"));
  GemmOptions beta_with_epilogue;
  beta_with_epilogue.epilogue = GemmEpilogue::kBias;
  const Tensor full_bias = RandomTensor({16}, -1.0f, 1.0f, 22);
  beta_with_epilogue.bias = &full_bias;
  beta_with_epilogue.beta = 1.0f;
  EXPECT_THAT(Gemm(Context::Cpu(), GemmOperand{f}, GemmOperand{f}, &d, beta_with_epilogue),
              HasError(kInvalid, "options.beta"));
}

}  // namespace
}  // namespace kernels
}  // namespace teserve
