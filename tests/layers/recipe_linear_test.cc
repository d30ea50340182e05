// Linear under the block recipes (MXFP8, FP8 block scaling, NVFP4) against FP64
// references on the dequantized operands each GEMM is specified to use:
//   fprop y = x W^T + b     x rowwise, W rowwise
//   dgrad dx = dy W         dy rowwise, W columnwise
//   wgrad dW = dy^T x       dy columnwise, x columnwise
// The references quantize with the kernels directly (themselves tested bit-exact against
// hand-computed vectors), so these tests pin down which copy feeds which GEMM.
#include <cmath>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/block_quantize.h"
#include "kernels/nvfp4.h"
#include "layers/linear.h"
#include "recipes/quantizer.h"
#include "tests/layers/grad_check.h"
#include "tests/layers/recipe_reference.h"

namespace teserve {
namespace layers {
namespace {

using kernels::Copy;
using testing_util::ExpectClose;
using testing_util::kE2M1;
using testing_util::kE4M3;
using testing_util::MakeRecipe;
using testing_util::MatMul;
using testing_util::Nvfp4;
using testing_util::QuantizedReference;
using testing_util::RandomTensor;
using testing_util::Tolerance;

struct RecipeCase {
  std::string name;
  recipes::Recipe recipe;
  int64_t rows, in, out;
  Tolerance te;  // TE's module tolerance for the format
};

class RecipeLinearTest : public testing::TestWithParam<RecipeCase> {};

TEST_P(RecipeLinearTest, GemmsUseTheSpecifiedCopies) {
  const RecipeCase& c = GetParam();
  LinearOptions options;
  options.in_features = c.in;
  options.out_features = c.out;
  options.init_std = 0.1f;
  options.seed = 4;
  auto linear = Linear::Create("fc", options, c.recipe).value();
  Parameter* weight = linear->Parameters()[0];
  Parameter* bias = linear->Parameters()[1];
  FillNormal(8, 0.5f, bias->value.mutable_floats());
  const Tensor x = RandomTensor({c.rows, c.in}, 5);
  const Tensor dy = RandomTensor({c.rows, c.out}, 6, 0.01f);

  auto fwd = linear->Forward(Context(), {x}, ForwardOptions()).value();
  auto dx = linear->Backward(Context(), *fwd.saved, {dy}).value();

  using recipes::TensorRole;
  const Tensor x_row = QuantizedReference(c.recipe, TensorRole::kInput, x, Copy::kRowwise);       // [rows, in]
  const Tensor x_col = QuantizedReference(c.recipe, TensorRole::kInput, x, Copy::kColumnwise);    // [in, rows]
  const Tensor w_row = QuantizedReference(c.recipe, TensorRole::kWeight, weight->value, Copy::kRowwise);     // [out, in]
  const Tensor w_col = QuantizedReference(c.recipe, TensorRole::kWeight, weight->value, Copy::kColumnwise);  // [in, out]
  const Tensor dy_row = QuantizedReference(c.recipe, TensorRole::kGradOutput, dy, Copy::kRowwise);     // [rows, out]
  const Tensor dy_col = QuantizedReference(c.recipe, TensorRole::kGradOutput, dy, Copy::kColumnwise);  // [out, rows]
  auto at = [](const Tensor& t, int64_t cols) {
    return [&t, cols](int64_t i, int64_t j) { return static_cast<double>(t.floats()[i * cols + j]); };
  };
  const int64_t rows = c.rows, in = c.in, out = c.out;

  std::vector<double> y = MatMul(rows, out, in, at(x_row, in), [&](int64_t k, int64_t j) { return at(w_row, in)(j, k); });
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < out; ++j) y[i * out + j] += bias->value.floats()[j];
  const std::vector<double> dx_ref =
      MatMul(rows, in, out, at(dy_row, out), [&](int64_t k, int64_t j) { return at(w_col, out)(j, k); });
  const std::vector<double> dw_ref =
      MatMul(out, in, rows, at(dy_col, rows), [&](int64_t k, int64_t j) { return at(x_col, rows)(j, k); });

  ExpectClose(fwd.outputs[0], y, c.te, "y (TE tolerance)");
  ExpectClose(dx[0], dx_ref, c.te, "dx (TE tolerance)");
  ExpectClose(weight->grad, dw_ref, c.te, "dW (TE tolerance)");
  // The FP32 GEMM on the same operands is much closer than TE's tolerance.
  ExpectClose(fwd.outputs[0], y, {1e-5, 1e-5}, "y");
  ExpectClose(dx[0], dx_ref, {1e-5, 1e-7}, "dx");
  ExpectClose(weight->grad, dw_ref, {1e-5, 1e-6}, "dW");
}

INSTANTIATE_TEST_SUITE_P(
    Recipes, RecipeLinearTest,
    testing::Values(RecipeCase{"mxfp8_64x96to32", MakeRecipe(recipes::Mxfp8Config()), 64, 96, 32, kE4M3},
                    RecipeCase{"block_weird_111x69to23", MakeRecipe(recipes::BlockScalingConfig()), 111, 69, 23, kE4M3},
                    RecipeCase{"block_1d_weights_130x256to129", MakeRecipe([] {
                                 recipes::BlockScalingConfig c;
                                 c.w_block_scaling_dim = 1;
                                 return c;
                               }()),
                               130, 256, 129, kE4M3},
                    RecipeCase{"nvfp4_plain_32x48to16", MakeRecipe(Nvfp4(false, false, false)), 32, 48, 16, kE2M1},
                    RecipeCase{"nvfp4_2d_rht_32x64to32", MakeRecipe(Nvfp4(true, false, true)), 32, 64, 32, kE2M1}),
    [](const testing::TestParamInfo<RecipeCase>& info) { return info.param.name; });

TEST(RecipeLinear, Nvfp4StochasticRoundingIsReproducibleAndUnbiasedEnough) {
  LinearOptions options;
  options.in_features = 64;
  options.out_features = 32;
  options.init_std = 0.1f;
  auto run = [&](uint64_t seed) {
    auto linear = Linear::Create("fc", options, MakeRecipe(Nvfp4(true, true, true))).value();
    Context ctx;
    ctx.seed = seed;
    const Tensor x = RandomTensor({32, 64}, 5);
    auto fwd = linear->Forward(ctx, {x}, ForwardOptions()).value();
    linear->Backward(ctx, *fwd.saved, {RandomTensor({32, 32}, 6, 0.01f)}).value();
    return linear->Parameters()[0]->grad.Clone().value();
  };
  const Tensor a = run(1), b = run(1), c = run(2);
  EXPECT_TRUE(BitwiseEqual(a, b));
  EXPECT_FALSE(BitwiseEqual(a, c));
}

TEST(RecipeLinear, CalibrationObservesAmaxesButComputesInHighPrecision) {
  recipes::Recipe calibrating = MakeRecipe(recipes::DelayedScalingConfig());
  calibrating.calibrating = true;
  LinearOptions options;
  options.in_features = 16;
  options.out_features = 8;
  auto cal = Linear::Create("fc", options, calibrating).value();
  auto plain = Linear::Create("fc", options, recipes::Recipe()).value();
  const Tensor x = RandomTensor({4, 16}, 3);
  auto y_cal = cal->Forward(Context(), {x}, ForwardOptions()).value();
  auto y_plain = plain->Forward(Context(), {x}, ForwardOptions()).value();
  EXPECT_TRUE(BitwiseEqual(y_cal.outputs[0], y_plain.outputs[0]));
  for (const NamedQuantizer& q : cal->Quantizers()) q.quantizer->EndRegion();
  const recipes::QuantizerSnapshot input = cal->Quantizers()[0].quantizer->Snapshot();
  EXPECT_GT(input.amax, 0.0f);
  EXPECT_EQ(input.quantize_calls, 0);
  EXPECT_EQ(input.scale, 448.0f / input.amax);  // the scale was updated from the observed amax
}

TEST(RecipeLinear, Mxfp8RejectsTokenCountsThatDoNotTile) {
  LinearOptions options;
  options.in_features = 32;
  options.out_features = 32;
  auto linear = Linear::Create("fc", options, MakeRecipe(recipes::Mxfp8Config())).value();
  auto shapes = linear->OutputShapes({{3, 10, 32}}, "inputs");
  EXPECT_EQ(shapes.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(shapes.status().message()).find("divisible by 32"), std::string::npos) << shapes.status();
}

}  // namespace
}  // namespace layers
}  // namespace teserve
