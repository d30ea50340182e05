// Gradient checks and forward references for Linear, LayerNorm, RMSNorm and LayerStack
// on the high-precision path.
#include <cmath>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "layers/layer_stack.h"
#include "layers/linear.h"
#include "layers/normalization.h"
#include "tests/layers/grad_check.h"

namespace teserve {
namespace layers {
namespace {

using testing_util::CheckGradients;
using testing_util::RandomTensor;

struct LinearCase {
  std::string name;
  int64_t rows, in, out;
  bool bias, return_bias;
};

class LinearGradTest : public testing::TestWithParam<LinearCase> {};

TEST_P(LinearGradTest, MatchesFiniteDifferences) {
  const LinearCase& c = GetParam();
  LinearOptions options;
  options.in_features = c.in;
  options.out_features = c.out;
  options.bias = c.bias;
  options.return_bias = c.return_bias;
  options.init_std = 0.5f;
  options.seed = 7;
  auto linear = Linear::Create("fc", options, recipes::Recipe()).value();
  if (c.bias) {
    // Non-zero bias so the forward reference exercises it.
    for (float& b : linear->Parameters()[1]->value.mutable_floats()) b = 0.25f;
  }
  CheckGradients(*linear, {RandomTensor({c.rows, c.in}, 3)});
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, LinearGradTest,
    testing::Values(LinearCase{"1x1to1", 1, 1, 1, true, false}, LinearCase{"4x8to5", 4, 8, 5, true, false},
                    LinearCase{"3x37to23_nobias", 3, 37, 23, false, false},
                    LinearCase{"5x16to7_returnbias", 5, 16, 7, true, true}),
    [](const testing::TestParamInfo<LinearCase>& info) { return info.param.name; });

TEST(Linear, ForwardMatchesDoubleReference) {
  LinearOptions options;
  options.in_features = 37;
  options.out_features = 23;
  options.seed = 11;
  auto linear = Linear::Create("fc", options, recipes::Recipe()).value();
  Parameter* w = linear->Parameters()[0];
  Parameter* b = linear->Parameters()[1];
  layers::FillNormal(5, 1.0f, b->value.mutable_floats());
  const Tensor x = RandomTensor({2, 3, 37}, 9);
  auto out = linear->Forward(Context(), {x}, ForwardOptions()).value();
  ASSERT_EQ(out.outputs[0].shape(), (Shape{2, 3, 23}));
  for (int r = 0; r < 6; ++r) {
    for (int o = 0; o < 23; ++o) {
      double ref = b->value.floats()[o];
      for (int i = 0; i < 37; ++i) ref += double(x.floats()[r * 37 + i]) * w->value.floats()[o * 37 + i];
      EXPECT_NEAR(out.outputs[0].floats()[r * 23 + o], ref, 1e-5 + 1.3e-6 * std::fabs(ref));
    }
  }
}

TEST(Linear, InitializesWeightsWithTeDefaultStd) {
  LinearOptions options;
  options.in_features = 256;
  options.out_features = 256;
  auto linear = Linear::Create("fc", options, recipes::Recipe()).value();
  double sum = 0.0, sum_sq = 0.0;
  absl::Span<const float> w = linear->Parameters()[0]->value.floats();
  for (float v : w) {
    sum += v;
    sum_sq += double(v) * v;
  }
  const double mean = sum / w.size();
  const double std = std::sqrt(sum_sq / w.size() - mean * mean);
  EXPECT_NEAR(mean, 0.0, 0.001);
  EXPECT_NEAR(std, 0.023, 0.001);
  for (float b : linear->Parameters()[1]->value.floats()) EXPECT_EQ(b, 0.0f);
}

struct NormCase {
  std::string name;
  NormKind kind;
  bool zero_centered;
  int64_t rows, hidden;
};

class NormGradTest : public testing::TestWithParam<NormCase> {};

TEST_P(NormGradTest, MatchesFiniteDifferences) {
  const NormCase& c = GetParam();
  NormOptions options;
  options.kind = c.kind;
  options.hidden_size = c.hidden;
  options.zero_centered_gamma = c.zero_centered;
  auto norm = Normalization::Create("norm", options).value();
  // Non-trivial parameters.
  for (Parameter* p : norm->Parameters()) layers::FillNormal(p->name.size(), 0.5f, p->value.mutable_floats());
  CheckGradients(*norm, {RandomTensor({c.rows, c.hidden}, 21, 2.0f)});
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, NormGradTest,
    testing::Values(NormCase{"LayerNorm_4x16", NormKind::kLayerNorm, false, 4, 16},
                    NormCase{"LayerNorm_zero_centered_3x37", NormKind::kLayerNorm, true, 3, 37},
                    NormCase{"RMSNorm_4x16", NormKind::kRmsNorm, false, 4, 16},
                    NormCase{"RMSNorm_zero_centered_3x37", NormKind::kRmsNorm, true, 3, 37}),
    [](const testing::TestParamInfo<NormCase>& info) { return info.param.name; });

TEST(Normalization, ZeroCenteredGammaStartsAtZeroAndActsAsOne) {
  NormOptions plain;
  plain.hidden_size = 8;
  NormOptions centered = plain;
  centered.zero_centered_gamma = true;
  auto a = Normalization::Create("a", plain).value();
  auto b = Normalization::Create("b", centered).value();
  for (float g : b->Parameters()[0]->value.floats()) EXPECT_EQ(g, 0.0f);
  const Tensor x = RandomTensor({3, 8}, 4);
  auto ya = a->Forward(Context(), {x}, ForwardOptions()).value();
  auto yb = b->Forward(Context(), {x}, ForwardOptions()).value();
  EXPECT_TRUE(BitwiseEqual(ya.outputs[0], yb.outputs[0]));
}

std::unique_ptr<LayerStack> SmallStack() {
  auto stack = std::make_unique<LayerStack>();
  NormOptions norm;
  norm.hidden_size = 12;
  stack->Append(Normalization::Create("ln", norm).value());
  LinearOptions fc1;
  fc1.in_features = 12;
  fc1.out_features = 9;
  fc1.init_std = 0.3f;
  fc1.seed = 1;
  stack->Append(Linear::Create("fc1", fc1, recipes::Recipe()).value());
  NormOptions rms;
  rms.kind = NormKind::kRmsNorm;
  rms.hidden_size = 9;
  rms.zero_centered_gamma = true;
  stack->Append(Normalization::Create("rms", rms).value());
  LinearOptions fc2;
  fc2.in_features = 9;
  fc2.out_features = 4;
  fc2.init_std = 0.3f;
  fc2.seed = 2;
  stack->Append(Linear::Create("fc2", fc2, recipes::Recipe()).value());
  return stack;
}

TEST(LayerStack, MatchesFiniteDifferences) {
  auto stack = SmallStack();
  CheckGradients(*stack, {RandomTensor({2, 3, 12}, 8)});
}

TEST(LayerStack, InterleavedMicrobatchesEqualSequentialOnes) {
  auto interleaved = SmallStack();
  auto sequential = SmallStack();
  const Tensor x1 = RandomTensor({5, 12}, 31), x2 = RandomTensor({3, 12}, 32);
  const Tensor g1 = RandomTensor({5, 4}, 33), g2 = RandomTensor({3, 4}, 34);

  // Two forwards in flight, backwards in reverse order.
  auto f1 = interleaved->Forward(Context(), {x1}, ForwardOptions()).value();
  auto f2 = interleaved->Forward(Context(), {x2}, ForwardOptions()).value();
  auto d2 = interleaved->Backward(Context(), *f2.saved, {g2}).value();
  auto d1 = interleaved->Backward(Context(), *f1.saved, {g1}).value();

  auto s1 = sequential->Forward(Context(), {x1}, ForwardOptions()).value();
  auto e1 = sequential->Backward(Context(), *s1.saved, {g1}).value();
  auto s2 = sequential->Forward(Context(), {x2}, ForwardOptions()).value();
  auto e2 = sequential->Backward(Context(), *s2.saved, {g2}).value();

  EXPECT_TRUE(BitwiseEqual(f1.outputs[0], s1.outputs[0]));
  EXPECT_TRUE(BitwiseEqual(d1[0], e1[0]));
  EXPECT_TRUE(BitwiseEqual(d2[0], e2[0]));
  auto pa = interleaved->Parameters();
  auto pb = sequential->Parameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i) {
    // Accumulation order differs (2 then 1 vs 1 then 2); FP32 sums may differ in the last bit.
    for (size_t k = 0; k < pa[i]->grad.floats().size(); ++k) {
      EXPECT_NEAR(pa[i]->grad.floats()[k], pb[i]->grad.floats()[k], 1e-5) << pa[i]->name;
    }
  }
}

TEST(LayerStack, OutputShapesNamesTheFieldOnMismatch) {
  auto stack = SmallStack();
  auto shapes = stack->OutputShapes({{4, 11}}, "inputs");
  EXPECT_EQ(shapes.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(shapes.status().message()),
              testing::HasSubstr("inputs[0].shape: expected last dimension 12 (hidden_size of layer 'ln'), got [4, 11]"));
  EXPECT_EQ(stack->OutputShapes({{2, 3, 12}}, "inputs").value(), (std::vector<Shape>{{2, 3, 4}}));
}

}  // namespace
}  // namespace layers
}  // namespace teserve
