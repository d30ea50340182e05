// LayerNormLinear: finite-difference gradient checks per option family, bitwise
// equality with Normalization followed by Linear under every recipe, FP64 references on
// dequantized operands within TE's tolerances, parameters_split, shapes, and spec
// validation through BuildStack.
#include "layers/layernorm_linear.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/elementwise.h"
#include "kernels/normalization.h"
#include "layers/linear.h"
#include "layers/normalization.h"
#include "layers/spec.h"
#include "tests/layers/grad_check.h"
#include "tests/layers/layer_test_util.h"
#include "tests/layers/recipe_reference.h"

namespace teserve {
namespace layers {
namespace {

using kernels::Copy;
using recipes::TensorRole;
using testing::HasSubstr;
using testing_util::At;
using testing_util::CheckGradients;
using testing_util::EndRegion;
using testing_util::ExpectClose;
using testing_util::ExpectSameQuantizerState;
using testing_util::MakeRecipe;
using testing_util::MatMul;
using testing_util::ParameterNames;
using testing_util::QuantizedReference;
using testing_util::RandomizeParameters;
using testing_util::RandomTensor;
using testing_util::RecipeCase;
using testing_util::Tolerance;

// ---- Finite differences per option family -------------------------------------------------

struct GradCase {
  std::string name;
  LayerNormLinearOptions options;
  Shape input;
};

void PrintTo(const GradCase& c, std::ostream* os) { *os << c.name; }

LayerNormLinearOptions Options(int64_t in, int64_t out) {
  LayerNormLinearOptions o;
  o.in_features = in;
  o.out_features = out;
  o.init_std = 0.5f;
  o.seed = 3;
  return o;
}

std::vector<GradCase> GradCases() {
  std::vector<GradCase> cases;
  cases.push_back({"LayerNorm_3x37to23", Options(37, 23), {3, 37}});
  {
    GradCase c{"RMSNorm_NoBias_4x16to8", Options(16, 8), {4, 16}};
    c.options.normalization = NormKind::kRmsNorm;
    c.options.bias = false;
    cases.push_back(c);
  }
  {
    GradCase c{"ZeroCenteredGamma_LayerNorm", Options(12, 6), {5, 12}};
    c.options.zero_centered_gamma = true;
    cases.push_back(c);
  }
  {
    GradCase c{"ZeroCenteredGamma_RMSNorm", Options(12, 6), {5, 12}};
    c.options.zero_centered_gamma = true;
    c.options.normalization = NormKind::kRmsNorm;
    cases.push_back(c);
  }
  {
    GradCase c{"ReturnBias", Options(16, 8), {4, 16}};
    c.options.return_bias = true;
    cases.push_back(c);
  }
  {
    GradCase c{"ReturnLayernormOutput", Options(16, 8), {4, 16}};
    c.options.return_layernorm_output = true;
    cases.push_back(c);
  }
  {
    GradCase c{"ReturnBiasAndLayernormOutput_Rank3", Options(16, 8), {2, 3, 16}};
    c.options.return_bias = true;
    c.options.return_layernorm_output = true;
    cases.push_back(c);
  }
  {
    GradCase c{"ParametersSplit_QKV", Options(16, 8), {4, 16}};
    c.options.parameters_split = {{"query", 4}, {"key", 2}, {"value", 2}};
    cases.push_back(c);
  }
  cases.push_back({"OneRow_1x5to3", Options(5, 3), {1, 5}});
  return cases;
}

class LayerNormLinearGradTest : public testing::TestWithParam<GradCase> {};

TEST_P(LayerNormLinearGradTest, MatchesFiniteDifferences) {
  const GradCase& c = GetParam();
  auto layer = LayerNormLinear::Create("ln_fc", c.options, recipes::Recipe()).value();
  RandomizeParameters(*layer, 40);
  CheckGradients(*layer, {RandomTensor(c.input, 11)});
}

INSTANTIATE_TEST_SUITE_P(OptionFamilies, LayerNormLinearGradTest, testing::ValuesIn(GradCases()),
                         [](const testing::TestParamInfo<GradCase>& info) { return info.param.name; });

// ---- Composition and recipes --------------------------------------------------------------

class LayerNormLinearRecipeTest : public testing::TestWithParam<RecipeCase> {};

// Two steps (forward, backward, region ends) of LayerNormLinear and of a Normalization
// and a Linear holding copies of its parameters give the same bits everywhere.
TEST_P(LayerNormLinearRecipeTest, EqualsNormalizationThenLinearBitwise) {
  const recipes::Recipe& recipe = GetParam().recipe;
  for (NormKind kind : {NormKind::kLayerNorm, NormKind::kRmsNorm}) {
    LayerNormLinearOptions o = Options(64, 32);
    o.normalization = kind;
    o.return_layernorm_output = true;
    auto fused = LayerNormLinear::Create("qkv", o, recipe).value();
    RandomizeParameters(*fused, 5);
    NormOptions n;
    n.kind = kind;
    n.hidden_size = 64;
    auto norm = Normalization::Create("norm", n).value();
    LinearOptions l;
    l.in_features = 64;
    l.out_features = 32;
    auto linear = Linear::Create("qkv", l, recipe).value();
    std::vector<Parameter*> parts = norm->Parameters();
    for (Parameter* p : linear->Parameters()) parts.push_back(p);
    std::vector<Parameter*> whole = fused->Parameters();
    ASSERT_EQ(parts.size(), whole.size());
    for (size_t i = 0; i < parts.size(); ++i) parts[i]->value = whole[i]->value.Clone().value();

    for (int step = 0; step < 2; ++step) {
      const Tensor x = RandomTensor({2, 16, 64}, 20 + step);
      const Tensor dy = RandomTensor({2, 16, 32}, 30 + step);
      const Tensor d_ln = RandomTensor({2, 16, 64}, 40 + step, 0.1f);
      auto f_out = fused->Forward(Context(), {x}, ForwardOptions()).value();
      EndRegion(*fused, true);
      auto n_out = norm->Forward(Context(), {x}, ForwardOptions()).value();
      auto l_out = linear->Forward(Context(), {n_out.outputs[0]}, ForwardOptions()).value();
      EndRegion(*linear, true);
      ASSERT_EQ(f_out.outputs.size(), 2u);
      EXPECT_TRUE(BitwiseEqual(f_out.outputs[0], l_out.outputs[0]));
      EXPECT_TRUE(BitwiseEqual(f_out.outputs[1], n_out.outputs[0]));

      auto f_dx = fused->Backward(Context(), *f_out.saved, {dy, d_ln}).value();
      EndRegion(*fused, false);
      auto l_dx = linear->Backward(Context(), *l_out.saved, {dy}).value();
      EndRegion(*linear, false);
      ASSERT_TRUE(kernels::AddInto(Context(), d_ln, &l_dx[0]).ok());
      auto n_dx = norm->Backward(Context(), *n_out.saved, l_dx).value();
      EXPECT_TRUE(BitwiseEqual(f_dx[0], n_dx[0]));
      for (size_t i = 0; i < parts.size(); ++i) EXPECT_TRUE(BitwiseEqual(whole[i]->grad, parts[i]->grad)) << i;
      ExpectSameQuantizerState(*fused, *linear);
    }
  }
}

// y = q(ln_out) q(W)^T + b, dW = q(dy)^T q(ln_out), d_ln = q(dy) q(W) in FP64 on the
// copies docs/te_facts.md ("GEMMs") assigns each GEMM; dx and dgamma/dbeta from d_ln through
// the normalization backward kernel (itself tested against FP64 closed forms).
TEST_P(LayerNormLinearRecipeTest, MatchesFp64ReferenceOnDequantizedOperands) {
  const RecipeCase& c = GetParam();
  const int64_t rows = 32, in = 64, out = 32;
  LayerNormLinearOptions o = Options(in, out);
  o.return_layernorm_output = true;  // to read ln_out; its gradient is 0 here
  auto layer = LayerNormLinear::Create("fc", o, c.recipe).value();
  RandomizeParameters(*layer, 9);
  std::vector<Parameter*> params = layer->Parameters();  // gamma, beta, W, b
  const Tensor x = RandomTensor({rows, in}, 5);
  const Tensor dy = RandomTensor({rows, out}, 6);
  const Tensor no_grad = Tensor::Zeros(DType::kFloat32, {rows, in}).value();
  auto fwd = layer->Forward(Context(), {x}, ForwardOptions()).value();
  auto dx = layer->Backward(Context(), *fwd.saved, {dy, no_grad}).value();
  for (const Tensor& t : {fwd.outputs[0], dx[0], params[2]->grad}) {
    for (float v : t.floats()) ASSERT_TRUE(std::isfinite(v));
  }

  const Tensor& ln = fwd.outputs[1];
  const Tensor& w = params[2]->value;
  const Tensor ln_row = QuantizedReference(c.recipe, TensorRole::kInput, ln, Copy::kRowwise);
  const Tensor ln_col = QuantizedReference(c.recipe, TensorRole::kInput, ln, Copy::kColumnwise);
  const Tensor w_row = QuantizedReference(c.recipe, TensorRole::kWeight, w, Copy::kRowwise);
  const Tensor w_col = QuantizedReference(c.recipe, TensorRole::kWeight, w, Copy::kColumnwise);
  const Tensor dy_row = QuantizedReference(c.recipe, TensorRole::kGradOutput, dy, Copy::kRowwise);
  const Tensor dy_col = QuantizedReference(c.recipe, TensorRole::kGradOutput, dy, Copy::kColumnwise);
  // Columnwise copies are transposed: W^T [in, out], dy^T [out, rows], ln^T [in, rows].
  std::vector<double> y = MatMul(rows, out, in, At(ln_row, in), [&](int64_t k, int64_t j) { return At(w_row, in)(j, k); });
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < out; ++j) y[i * out + j] += params[3]->value.floats()[j];
  const std::vector<double> d_ln =
      MatMul(rows, in, out, At(dy_row, out), [&](int64_t k, int64_t j) { return At(w_col, out)(j, k); });
  const std::vector<double> dw =
      MatMul(out, in, rows, At(dy_col, rows), [&](int64_t k, int64_t j) { return At(ln_col, rows)(j, k); });
  std::vector<float> d_ln_f(d_ln.begin(), d_ln.end());
  const Tensor d_ln_t = Tensor::FromFloats(d_ln_f, {rows, in}).value();
  auto stats = kernels::LayerNormForward(Context(), x, params[0]->value, params[1]->value, 1e-5f, false).value();
  auto norm_grads = kernels::LayerNormBackward(Context(), d_ln_t, x, stats.mu, stats.rsigma, params[0]->value,
                                               false).value();
  const std::vector<double> dx_ref(norm_grads.dx.floats().begin(), norm_grads.dx.floats().end());
  const std::vector<double> dgamma_ref(norm_grads.dgamma.floats().begin(), norm_grads.dgamma.floats().end());

  ExpectClose(fwd.outputs[0], y, c.te, "y (TE tolerance)");
  ExpectClose(dx[0], dx_ref, c.te, "dx (TE tolerance)");
  ExpectClose(params[2]->grad, dw, c.te, "dW (TE tolerance)");
  ExpectClose(params[0]->grad, dgamma_ref, c.te, "dgamma (TE tolerance)");
  // The layer runs exactly these GEMMs: FP32 accumulation is all that separates them.
  ExpectClose(fwd.outputs[0], y, {1e-5, 1e-5}, "y");
  ExpectClose(params[2]->grad, dw, {1e-5, 1e-5}, "dW");
  ExpectClose(dx[0], dx_ref, {1e-4, 1e-5}, "dx");
}

INSTANTIATE_TEST_SUITE_P(Recipes, LayerNormLinearRecipeTest, testing::ValuesIn(testing_util::EveryRecipe()),
                         [](const testing::TestParamInfo<RecipeCase>& info) { return info.param.name; });

// ---- Parameters and shapes ----------------------------------------------------------------

TEST(LayerNormLinear, ParameterNamesFollowTe) {
  auto ln = LayerNormLinear::Create("qkv", Options(8, 4), recipes::Recipe()).value();
  EXPECT_THAT(ParameterNames(*ln),
              testing::ElementsAre("qkv.layer_norm_weight", "qkv.layer_norm_bias", "qkv.weight", "qkv.bias"));
  LayerNormLinearOptions o = Options(8, 4);
  o.normalization = NormKind::kRmsNorm;
  o.bias = false;
  auto rms = LayerNormLinear::Create("qkv", o, recipes::Recipe()).value();
  EXPECT_THAT(ParameterNames(*rms), testing::ElementsAre("qkv.layer_norm_weight", "qkv.weight"));
  EXPECT_EQ(ln->Quantizers().size(), 0u);
  auto quantized = LayerNormLinear::Create("qkv", Options(8, 4), MakeRecipe(recipes::DelayedScalingConfig())).value();
  ASSERT_EQ(quantized->Quantizers().size(), 3u);
  EXPECT_EQ(quantized->Quantizers()[0].layer, "qkv");
}

TEST(LayerNormLinear, InitializesLikeNormalizationAndLinear) {
  LayerNormLinearOptions o = Options(8, 4);
  o.seed = 17;
  auto fused = LayerNormLinear::Create("a", o, recipes::Recipe()).value();
  LinearOptions l;
  l.in_features = 8;
  l.out_features = 4;
  l.init_std = o.init_std;
  l.seed = 17;
  auto linear = Linear::Create("b", l, recipes::Recipe()).value();
  EXPECT_TRUE(BitwiseEqual(fused->Parameters()[2]->value, linear->Parameters()[0]->value));
  for (float g : fused->Parameters()[0]->value.floats()) EXPECT_EQ(g, 1.0f);
  for (float b : fused->Parameters()[3]->value.floats()) EXPECT_EQ(b, 0.0f);
}

// parameters_split blocks are views of one weight: the split layer computes bitwise what
// the unsplit one does, and the blocks' gradients are the rows of the whole gradient.
TEST(LayerNormLinear, ParametersSplitBlocksAreRowsOfOneWeight) {
  LayerNormLinearOptions o = Options(16, 8);
  auto whole = LayerNormLinear::Create("attn", o, recipes::Recipe()).value();
  o.parameters_split = {{"query_", 4}, {"key", 3}, {"value__", 1}};
  auto split = LayerNormLinear::Create("attn", o, recipes::Recipe()).value();
  EXPECT_THAT(ParameterNames(*split),
              testing::ElementsAre("attn.layer_norm_weight", "attn.layer_norm_bias", "attn.query_weight",
                                   "attn.key_weight", "attn.value_weight", "attn.query_bias", "attn.key_bias",
                                   "attn.value_bias"));
  std::vector<Parameter*> s = split->Parameters();
  EXPECT_EQ(s[2]->value.shape(), (Shape{4, 16}));
  EXPECT_EQ(s[4]->value.shape(), (Shape{1, 16}));
  EXPECT_EQ(s[6]->value.shape(), (Shape{3}));
  // Writing a block writes the layer's weight.
  FillNormal(99, 1.0f, s[3]->value.mutable_floats());
  FillNormal(98, 1.0f, s[6]->value.mutable_floats());
  Parameter* w = whole->Parameters()[2];
  Parameter* b = whole->Parameters()[3];
  std::copy(s[3]->value.floats().begin(), s[3]->value.floats().end(), w->value.mutable_floats().begin() + 4 * 16);
  std::copy(s[6]->value.floats().begin(), s[6]->value.floats().end(), b->value.mutable_floats().begin() + 4);

  const Tensor x = RandomTensor({5, 16}, 1);
  const Tensor dy = RandomTensor({5, 8}, 2);
  auto ys = split->Forward(Context(), {x}, ForwardOptions()).value();
  auto yw = whole->Forward(Context(), {x}, ForwardOptions()).value();
  EXPECT_TRUE(BitwiseEqual(ys.outputs[0], yw.outputs[0]));
  split->Backward(Context(), *ys.saved, {dy}).value();
  whole->Backward(Context(), *yw.saved, {dy}).value();
  std::vector<float> concatenated;
  for (int i : {2, 3, 4}) concatenated.insert(concatenated.end(), s[i]->grad.floats().begin(), s[i]->grad.floats().end());
  EXPECT_TRUE(std::equal(concatenated.begin(), concatenated.end(), w->grad.floats().begin(), w->grad.floats().end()));
  std::vector<float> bias_grads;
  for (int i : {5, 6, 7}) bias_grads.insert(bias_grads.end(), s[i]->grad.floats().begin(), s[i]->grad.floats().end());
  EXPECT_TRUE(std::equal(bias_grads.begin(), bias_grads.end(), b->grad.floats().begin(), b->grad.floats().end()));
}

TEST(LayerNormLinear, RejectsBadParametersSplit) {
  LayerNormLinearOptions o = Options(16, 8);
  o.parameters_split = {{"query", 4}, {"key", 3}};
  EXPECT_THAT(LayerNormLinear::Create("a", o, recipes::Recipe()).status().message(),
              HasSubstr("parameters_split: expected sizes summing to out_features 8, got 7"));
  o.parameters_split = {{"query", 4}, {"query_", 4}};
  EXPECT_THAT(LayerNormLinear::Create("a", o, recipes::Recipe()).status().message(),
              HasSubstr("parameters_split[1].name: expected a name unique within parameters_split, got 'query' again"));
  o.parameters_split = {{"__", 8}};
  EXPECT_THAT(LayerNormLinear::Create("a", o, recipes::Recipe()).status().message(),
              HasSubstr("parameters_split[0].name: expected a non-empty name"));
  o.parameters_split = {{"q", 0}, {"k", 8}};
  EXPECT_THAT(LayerNormLinear::Create("a", o, recipes::Recipe()).status().message(),
              HasSubstr("parameters_split[0].size: expected a size in 1..8 (out_features), got 0"));
}

TEST(LayerNormLinear, OutputShapesFollowTheFlags) {
  LayerNormLinearOptions o = Options(16, 8);
  o.return_bias = true;
  o.return_layernorm_output = true;
  auto layer = LayerNormLinear::Create("fc", o, recipes::Recipe()).value();
  auto shapes = layer->OutputShapes({{2, 3, 16}}, "inputs").value();
  EXPECT_THAT(shapes, testing::ElementsAre(Shape{2, 3, 8}, Shape{8}, Shape{2, 3, 16}));
  auto forward = layer->Forward(Context(), {RandomTensor({2, 3, 16}, 1)}, ForwardOptions()).value();
  ASSERT_EQ(forward.outputs.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(forward.outputs[i].shape(), shapes[i]);
  EXPECT_THAT(std::string(layer->OutputShapes({{2, 15}}, "inputs").status().message()),
              HasSubstr("inputs[0].shape: expected last dimension 16 (in_features of layer 'fc'), got [2, 15]"));
  auto mx = LayerNormLinear::Create("fc", Options(32, 32), MakeRecipe(recipes::Mxfp8Config())).value();
  EXPECT_THAT(std::string(mx->OutputShapes({{3, 32}}, "inputs").status().message()), HasSubstr("divisible by 32"));
}

// ---- Spec -------------------------------------------------------------------------------

v1::ModelSpec LayerNormLinearModel() {
  v1::ModelSpec spec;
  auto* layer = spec.add_layers();
  layer->set_name("qkv");
  auto* s = layer->mutable_layer_norm_linear();
  s->set_in_features(64);
  s->set_out_features(96);
  auto* fc = spec.add_layers()->mutable_linear();
  fc->set_in_features(96);
  fc->set_out_features(32);
  return spec;
}

TEST(LayerNormLinearSpec, BuildsTheLayerWithTeDefaults) {
  v1::ModelSpec spec = LayerNormLinearModel();
  auto* s = spec.mutable_layers(0)->mutable_layer_norm_linear();
  s->set_normalization("RMSNorm");
  for (const char* name : {"query", "key", "value"}) s->add_parameters_split()->set_name(name);
  auto stack = BuildStack(spec, recipes::Recipe());
  ASSERT_TRUE(stack.ok()) << stack.status();
  Module& layer = *(*stack)->modules()[0];
  EXPECT_EQ(layer.kind(), "LayerNormLinear");
  EXPECT_THAT(ParameterNames(layer),
              testing::ElementsAre("qkv.layer_norm_weight", "qkv.query_weight", "qkv.key_weight", "qkv.value_weight",
                                   "qkv.query_bias", "qkv.key_bias", "qkv.value_bias"));
  EXPECT_EQ(layer.Parameters()[1]->value.shape(), (Shape{32, 64}));
  auto y = (*stack)->Forward(Context(), {RandomTensor({4, 64}, 1)}, ForwardOptions());
  ASSERT_TRUE(y.ok()) << y.status();
  EXPECT_EQ(y->outputs[0].shape(), (Shape{4, 32}));
}

using BadSpec = testing_util::BadLayerSpec<v1::LayerNormLinearSpec>;

class LayerNormLinearSpecErrors : public testing::TestWithParam<BadSpec> {};

TEST_P(LayerNormLinearSpecErrors, NameTheField) {
  v1::ModelSpec spec = LayerNormLinearModel();
  GetParam().mutate(spec.mutable_layers(0)->mutable_layer_norm_linear());
  testing_util::ExpectSpecError(spec, GetParam().recipe, GetParam().message);
}

const char kF[] = "model.layers[0].layer_norm_linear.";

INSTANTIATE_TEST_SUITE_P(
    Cases, LayerNormLinearSpecErrors,
    testing::Values(
        BadSpec{"ZeroInFeatures", [](v1::LayerNormLinearSpec* s) { s->set_in_features(0); },
                absl::StrCat(kF, "in_features: expected a size in 1..16777216, got 0")},
        BadSpec{"NegativeOutFeatures", [](v1::LayerNormLinearSpec* s) { s->set_out_features(-2); },
                absl::StrCat(kF, "out_features: expected a size in 1..16777216, got -2")},
        BadSpec{"ZeroEps", [](v1::LayerNormLinearSpec* s) { s->set_eps(0.0f); },
                absl::StrCat(kF, "eps: expected a finite value > 0, got 0")},
        BadSpec{"NegativeInitStd", [](v1::LayerNormLinearSpec* s) { s->set_init_std(-1.0f); },
                absl::StrCat(kF, "init_std: expected a finite value >= 0, got -1")},
        BadSpec{"UnknownNormalization", [](v1::LayerNormLinearSpec* s) { s->set_normalization("layernorm"); },
                absl::StrCat(kF, "normalization: expected one of LayerNorm, RMSNorm, got 'layernorm'")},
        BadSpec{"SplitSum",
                [](v1::LayerNormLinearSpec* s) {
                  auto* q = s->add_parameters_split();
                  q->set_name("q");
                  q->set_size(64);
                  auto* k = s->add_parameters_split();
                  k->set_name("k");
                  k->set_size(16);
                },
                absl::StrCat(kF, "parameters_split: expected sizes summing to out_features 96, got 80")},
        BadSpec{"SplitMixedSizes",
                [](v1::LayerNormLinearSpec* s) {
                  s->add_parameters_split()->set_name("q");
                  auto* k = s->add_parameters_split();
                  k->set_name("k");
                  k->set_size(96);
                },
                absl::StrCat(kF, "parameters_split[0].size: expected a size in 1..96 (out_features), got 0")},
        BadSpec{"SplitEqualNotDividing",
                [](v1::LayerNormLinearSpec* s) {
                  for (const char* n : {"a", "b", "c", "d", "e"}) s->add_parameters_split()->set_name(n);
                },
                absl::StrCat(kF, "parameters_split: expected blocks that divide out_features 96 equally")},
        BadSpec{"SplitDuplicateName",
                [](v1::LayerNormLinearSpec* s) {
                  for (const char* n : {"q", "q"}) s->add_parameters_split()->set_name(n);
                },
                absl::StrCat(kF, "parameters_split[1].name: expected a name unique")},
        BadSpec{"ReturnBiasNotLast", [](v1::LayerNormLinearSpec* s) { s->set_return_bias(true); },
                absl::StrCat(kF, "return_bias: expected false (only the last layer of a stack may return extra "
                                 "outputs), got true")},
        BadSpec{"ReturnLayernormOutputNotLast",
                [](v1::LayerNormLinearSpec* s) { s->set_return_layernorm_output(true); },
                absl::StrCat(kF, "return_layernorm_output: expected false")},
        BadSpec{"Mxfp8InFeatures", [](v1::LayerNormLinearSpec* s) { s->set_in_features(48); },
                absl::StrCat(kF, "in_features: expected a multiple of 32 (mxfp8 blocks must tile it), got 48"),
                MakeRecipe(recipes::Mxfp8Config())},
        BadSpec{"Nvfp4OutFeatures", [](v1::LayerNormLinearSpec* s) { s->set_out_features(40); },
                absl::StrCat(kF, "out_features: expected a multiple of 16 (nvfp4 blocks must tile it), got 40"),
                MakeRecipe(recipes::Nvfp4Config())}),
    [](const testing::TestParamInfo<BadSpec>& info) { return info.param.name; });

TEST(LayerNormLinearSpec, WidthMismatchNamesInFeatures) {
  v1::ModelSpec spec;
  spec.add_layers()->mutable_rms_norm()->set_hidden_size(32);
  auto* s = spec.add_layers()->mutable_layer_norm_linear();
  s->set_in_features(64);
  s->set_out_features(8);
  EXPECT_THAT(std::string(BuildStack(spec, recipes::Recipe()).status().message()),
              HasSubstr("model.layers[1].layer_norm_linear.in_features: expected 32 (the output width of layer "
                        "'layers.0'), got 64"));
}

}  // namespace
}  // namespace layers
}  // namespace teserve
