// FP8 Linear against FP64 references: exact on the dequantized operands (the
// computation the recipe defines), and within TE's tolerances of the unquantized math.
#include <cmath>
#include <string>
#include <vector>

#include "core/float_codec.h"
#include "gtest/gtest.h"
#include "layers/linear.h"
#include "tests/layers/grad_check.h"

namespace teserve {
namespace layers {
namespace {

using testing_util::RandomTensor;

// Per-tensor current scaling, recomputed here independently of recipes/.
std::vector<double> Dequantized(absl::Span<const float> x, bool e5m2) {
  const float fp8_max = e5m2 ? 57344.0f : 448.0f;
  float amax = 0.0f;
  for (float v : x) amax = std::max(amax, std::fabs(v));
  const float scale = fp8_max / amax;
  const float scale_inv = 1.0f / scale;
  std::vector<double> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const float q = e5m2 ? E5M2ToFloat(FloatToE5M2(x[i] * scale)) : E4M3ToFloat(FloatToE4M3(x[i] * scale));
    out[i] = static_cast<double>(q) * scale_inv;
  }
  return out;
}

std::vector<double> AsDouble(absl::Span<const float> x) { return std::vector<double>(x.begin(), x.end()); }

// C[m, n] = sum_k A[m, k] * B[n, k] (both row-major, B read transposed).
std::vector<double> MatMulNT(const std::vector<double>& a, const std::vector<double>& b, int64_t m, int64_t n,
                             int64_t k) {
  std::vector<double> c(m * n, 0.0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j)
      for (int64_t p = 0; p < k; ++p) c[i * n + j] += a[i * k + p] * b[j * k + p];
  return c;
}

std::vector<double> Transpose(const std::vector<double>& a, int64_t rows, int64_t cols) {
  std::vector<double> t(a.size());
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) t[j * rows + i] = a[i * cols + j];
  return t;
}

// ||got - want|| / ||want||: how much quantization moved the result overall.
double RelativeError(absl::Span<const float> got, const std::vector<double>& want) {
  double diff = 0.0, norm = 0.0;
  for (size_t i = 0; i < want.size(); ++i) {
    diff += (got[i] - want[i]) * (got[i] - want[i]);
    norm += want[i] * want[i];
  }
  return std::sqrt(diff / norm);
}

void ExpectClose(absl::Span<const float> got, const std::vector<double>& want, double rtol, double atol,
                 const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int failures = 0;
  for (size_t i = 0; i < got.size() && failures < 5; ++i) {
    if (std::fabs(got[i] - want[i]) > atol + rtol * std::fabs(want[i])) {
      ADD_FAILURE() << what << "[" << i << "]: got " << got[i] << ", want " << want[i];
      ++failures;
    }
  }
}

struct Fp8Case {
  std::string name;
  Shape input_shape;  // [..., in]
  int64_t out;
};

class Fp8LinearTest : public testing::TestWithParam<Fp8Case> {};

TEST_P(Fp8LinearTest, CurrentScalingMatchesReferences) {
  const Fp8Case& c = GetParam();
  const int64_t in = c.input_shape.back();
  int64_t rows = 1;
  for (size_t i = 0; i + 1 < c.input_shape.size(); ++i) rows *= c.input_shape[i];

  recipes::Recipe recipe;
  recipe.config = recipes::CurrentScalingConfig();
  LinearOptions options;
  options.in_features = in;
  options.out_features = c.out;
  options.init_std = 0.1f;
  options.seed = 3;
  auto linear = Linear::Create("fc", options, recipe).value();
  Parameter* weight = linear->Parameters()[0];
  Parameter* bias = linear->Parameters()[1];
  FillNormal(17, 0.5f, bias->value.mutable_floats());

  const Tensor x = RandomTensor(c.input_shape, 5);
  auto fwd = linear->Forward(Context(), {x}, ForwardOptions()).value();
  Shape dy_shape = c.input_shape;
  dy_shape.back() = c.out;
  const Tensor dy = RandomTensor(dy_shape, 6, 0.01f);
  auto dx = linear->Backward(Context(), *fwd.saved, {dy}).value();

  const auto xd = Dequantized(x.floats(), false);
  const auto wd = Dequantized(weight->value.floats(), false);
  const auto dyd = Dequantized(dy.floats(), true);
  const auto xf = AsDouble(x.floats()), wf = AsDouble(weight->value.floats()), dyf = AsDouble(dy.floats());

  // fprop: y = x W^T + b.
  auto y_q = MatMulNT(xd, wd, rows, c.out, in);
  auto y_f = MatMulNT(xf, wf, rows, c.out, in);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t o = 0; o < c.out; ++o) {
      y_q[r * c.out + o] += bias->value.floats()[o];
      y_f[r * c.out + o] += bias->value.floats()[o];
    }
  // TE's module tolerance against the dequantized reference, and the much tighter bound
  // our FP32 GEMM actually achieves; then the overall quantization error.
  ExpectClose(fwd.outputs[0].floats(), y_q, 0.125, 0.0675, "y vs dequantized reference (E4M3 tolerance)");
  ExpectClose(fwd.outputs[0].floats(), y_q, 1e-5, 1e-5, "y vs dequantized reference");
  EXPECT_LT(RelativeError(fwd.outputs[0].floats(), y_f), 0.08) << "y vs unquantized";

  // dgrad: dx = dy W (W^T read as [in, out] rows).
  const auto dx_q = MatMulNT(dyd, Transpose(wd, c.out, in), rows, in, c.out);
  const auto dx_f = MatMulNT(dyf, Transpose(wf, c.out, in), rows, in, c.out);
  ExpectClose(dx[0].floats(), dx_q, 0.25, 0.125, "dx vs dequantized reference (E5M2 tolerance)");
  ExpectClose(dx[0].floats(), dx_q, 1e-5, 1e-7, "dx vs dequantized reference");
  EXPECT_LT(RelativeError(dx[0].floats(), dx_f), 0.15) << "dx vs unquantized";

  // wgrad: dW = dy^T x.
  const auto dw_q = MatMulNT(Transpose(dyd, rows, c.out), Transpose(xd, rows, in), c.out, in, rows);
  const auto dw_f = MatMulNT(Transpose(dyf, rows, c.out), Transpose(xf, rows, in), c.out, in, rows);
  ExpectClose(weight->grad.floats(), dw_q, 0.25, 0.125, "dW vs dequantized reference (E5M2 tolerance)");
  ExpectClose(weight->grad.floats(), dw_q, 1e-5, 1e-6, "dW vs dequantized reference");
  EXPECT_LT(RelativeError(weight->grad.floats(), dw_f), 0.15) << "dW vs unquantized";
}

INSTANTIATE_TEST_SUITE_P(Shapes, Fp8LinearTest,
                         testing::Values(Fp8Case{"16x32to24", {16, 32}, 24},
                                         // TE's "weird" config: seq 37, batch 3, 3 heads x 23.
                                         Fp8Case{"weird_37x3x69to23", {37, 3, 69}, 23},
                                         Fp8Case{"1x1to1", {1, 1}, 1}),
                         [](const testing::TestParamInfo<Fp8Case>& info) { return info.param.name; });

TEST(Fp8Linear, DelayedScalingQuantizesStepTWithAmaxesUpToStepTMinusOne) {
  recipes::Recipe recipe;
  recipes::DelayedScalingConfig config;
  config.amax_history_len = 4;
  recipe.config = config;
  LinearOptions options;
  options.in_features = 8;
  options.out_features = 4;
  options.bias = false;
  auto linear = Linear::Create("fc", options, recipe).value();
  const Tensor x1 = RandomTensor({4, 8}, 1, 2.0f);
  const Tensor x2 = RandomTensor({4, 8}, 2, 0.5f);
  ForwardOptions no_save;
  no_save.save_for_backward = false;

  linear->Forward(Context(), {x1}, no_save).value();
  for (const NamedQuantizer& q : linear->Quantizers()) q.quantizer->EndRegion();
  auto y2 = linear->Forward(Context(), {x2}, no_save).value();

  // Reference: x2 quantized with scale 448 / amax(x1), W with 448 / amax(W).
  float amax1 = 0.0f;
  for (float v : x1.floats()) amax1 = std::max(amax1, std::fabs(v));
  const float sx = 448.0f / amax1;
  const auto wd = Dequantized(linear->Parameters()[0]->value.floats(), false);
  std::vector<double> xd(x2.numel());
  for (int64_t i = 0; i < x2.numel(); ++i) xd[i] = double(E4M3ToFloat(FloatToE4M3(x2.floats()[i] * sx))) * (1.0f / sx);
  ExpectClose(y2.outputs[0].floats(), MatMulNT(xd, wd, 4, 4, 8), 1e-5, 1e-6, "step 2 output");
}

}  // namespace
}  // namespace layers
}  // namespace teserve
